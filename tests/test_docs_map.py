"""docs/architecture.md is a map of the code, not a specification (issue 35, item 7): it names
every package, every module or folder it names exists, and it stays short enough to read. The
behaviour it once specified lives in the user docs (docs/conventions.md, docs/launch.md, ...).
Reads files only: well under a second."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "ttmesh"
MAP = REPO / "docs" / "architecture.md"
MAX_LINES = 300

# Where a name in the map may be rooted: the package (`launcher/job/feed.py`), the launcher's
# stages (`job/feed.py`, `serving.watch`, as the map says them inside "The launcher"), the repo
# (`tests/test_architecture.py`, `scripts/bench.py`).
ROOTS = (PACKAGE, PACKAGE / "launcher", REPO)

# A path the map points at: `a/b/` or `a/b` in backticks, `a/b.py` or a bare `b.py` anywhere.
# A bare module is named in the folder the text last named on that line or paragraph (`cli/`:
# `ls.py`, ...), so it must be that folder's; a heading, a bullet or a table row starts afresh.
NAMED = re.compile(
    r"`((?:ttmesh/)?[a-z_]\w*/(?:[\w.-]+/)*[\w.-]*)`"
    r"|(?<![\w/.-])((?:[a-z_]\w*/)*[a-z_]\w*\.py)\b"
)
# `launcher.job.feed`, `serving.watch.Watch`: a dotted name that starts at one of ttmesh's packages
# or modules (the rest may be a class, a function or an attribute); a file's name is no module.
FILE_ENDINGS = (".py", ".md", ".yaml", ".json", ".toml", ".txt")
DOTTED = re.compile(r"`((?:ttmesh\.)?[a-z_]\w*(?:\.[A-Za-z_]\w*)+)`")


def packages() -> list[str]:
    """Every package under ttmesh/, by its path below it (`launcher/fleet`)."""
    found = [p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py")]
    return sorted(p for p in found if p != "." and "__pycache__" not in p)


def exists(path: str) -> bool:
    path = path.rstrip("/")
    return any((root / path).exists() for root in ROOTS)


def resolves(dotted: str) -> bool:
    """True when the dotted name's first parts are ttmesh's packages and modules as named: the
    walk goes through packages, and a name inside a package must be one of its modules or
    subpackages; once a module (a .py file) is reached, the rest is what it defines."""
    parts = dotted.removeprefix("ttmesh.").split(".")
    for root in (PACKAGE, PACKAGE / "launcher"):
        here, walked = root, 0
        for part in parts:
            if (here / part / "__init__.py").exists():
                here, walked = here / part, walked + 1
                continue
            if (here / f"{part}.py").exists():
                walked += 1
                break
            if walked:
                # a package was named: the next name is its module, or a name its
                # __init__.py defines (`cli.COMMANDS`)
                init = (here / "__init__.py").read_text()
                return re.search(rf"^(?:def |class )?{re.escape(part)}\b", init, re.M) is not None
            break
        if walked:
            return True
    # Not ttmesh's: a Python or a tool's name (`os.environ`).
    return True


def test_the_map_names_every_package() -> None:
    text = MAP.read_text()
    missing = [p for p in packages() if not re.search(rf"(?<![\w/]){re.escape(p)}(?![\w])", text)]
    assert not missing, f"docs/architecture.md does not name these packages: {missing}"


def named_paths(text: str) -> list[str]:
    """Every path the map names, a bare module resolved in the folder named before it."""
    paths: list[str] = []
    folder = ""
    for line in text.splitlines():
        if line.lstrip().startswith(("#", "*", "|")):
            folder = ""
        for match in NAMED.finditer(line):
            given = match.group(1) or match.group(2)
            path = given.removeprefix("ttmesh/")
            if "/" not in given:
                path = f"{folder}{path}"
            elif path.endswith("/"):
                folder = path
            else:
                folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
            paths.append(path)
    return paths


def test_every_path_the_map_names_exists() -> None:
    absent = sorted({p for p in named_paths(MAP.read_text()) if not exists(p)})
    assert not absent, f"docs/architecture.md names paths that do not exist: {absent}"


def test_every_module_the_map_names_exists() -> None:
    text = MAP.read_text()
    names = {d for d in DOTTED.findall(text) if not d.endswith(FILE_ENDINGS)}
    absent = sorted(d for d in names if not resolves(d))
    assert not absent, f"docs/architecture.md names modules that do not exist: {absent}"


def test_the_map_is_short() -> None:
    count = len(MAP.read_text().splitlines())
    assert count <= MAX_LINES, (
        f"docs/architecture.md is {count} lines: a map is at most {MAX_LINES} "
        "(behaviour belongs in the user docs: docs/conventions.md, docs/launch.md, ...)"
    )


def test_the_guide_lists_every_page() -> None:
    """docs/README.md, the guide's index, links every page in docs/."""
    index = (REPO / "docs" / "README.md").read_text()
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    unlisted = [p for p in pages if f"]({p}" not in index]
    assert not unlisted, f"docs/README.md does not link: {unlisted}"


def test_links_to_the_docs_name_sections_that_exist() -> None:
    """A link `page.md#anchor` anywhere in the docs or the README lands on a heading of that
    page (GitHub's anchors: lower case, punctuation dropped, spaces as dashes)."""
    docs = REPO / "docs"
    anchors: dict[str, set[str]] = {}
    for page in docs.glob("*.md"):
        heads = re.findall(r"^#+\s+(.*)$", page.read_text(), flags=re.M)
        anchors[page.name] = {
            re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads
        }
    broken = []
    for source in [*docs.glob("*.md"), REPO / "README.md"]:
        for target, anchor in re.findall(
            r"\]\(((?:docs/)?[\w-]*\.md)?#([\w-]+)\)", source.read_text()
        ):
            if not target and source.parent == REPO:
                continue  # the repository's README: its own headings are not docs/'s
            page = Path(target).name if target else source.name
            if page in anchors and anchor not in anchors[page]:
                broken.append(f"{source.name}: {target}#{anchor}")
    assert not broken, f"links to sections that do not exist: {broken}"
