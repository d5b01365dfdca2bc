"""Every relative link in the README, docs/ and the results index reaches a file that exists, and every #anchor
one of its headings (GitHub's slugs) or an explicit <a id>: moving text between pages must not leave dead links."""
from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "results" / "INDEX.md"]


def _slug(heading: str) -> str:
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
  text = page.read_text()
  found, seen = set(re.findall(r'<a id="([^"]+)"', text)), {}
  for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
    s = _slug(heading)
    found.add(s if s not in seen else f"{s}-{seen[s]}")
    seen[s] = seen.get(s, 0) + 1
  return found


def test_every_relative_link_and_anchor_resolves():
  bad = []
  for page in PAGES:
    for link in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", page.read_text(), flags=re.S)):
      if re.match(r"[a-z]+:", link):
        continue
      path, _, frag = link.partition("#")
      target = (page.parent / path).resolve() if path else page
      if not target.exists():
        bad.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
      elif frag and target.suffix == ".md" and frag not in _anchors(target):
        bad.append(f"{page.relative_to(ROOT)}: {link} (no such anchor)")
  assert not bad, "\n".join(bad)


def test_the_check_sees_a_dead_anchor(tmp_path):
  page = tmp_path / "p.md"
  page.write_text("# Title here\n<a id=\"x\"></a>\n")
  assert _anchors(page) == {"title-here", "x"}
