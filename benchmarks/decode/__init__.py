"""End-to-end decoding: settings compared from one prefill, the context sweep, long outputs, datagen, auto."""
