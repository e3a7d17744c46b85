#!/usr/bin/env bash
# Checks the workspace's shape; no build, no network, no extra tools (cargo metadata,
# python3 stdlib). Prints one line per violation and exits 1, or one "ok" line.
#
#   scripts/check-shape.sh
#
#  1. Layering: which workspace crates each crate may depend on, and which external crates
#     it must not ([dependencies], [dev-dependencies], [build-dependencies] and their
#     [target.*] forms all count). Every workspace member must have a row in RULES.
#  2. Unused dependencies (what cargo-machete does): every dependency a crate declares must
#     be named in its Rust sources (src/, tests/, benches/, examples/, build.rs and any
#     explicit target path) as `ident::`, `use ident` or `extern crate ident`.
#     A dependency can be needed with no such path use, e.g. one declared only to enable a
#     feature (or pin a version) of a crate pulled in by another dependency, or a crate used
#     only through another crate's derive or macro. List those in IGNORED below or in the
#     crate's own Cargo.toml:
#         [package.metadata.check-shape]
#         ignored = ["dep-name"]   # and a comment saying why
set -euo pipefail
cd "$(dirname "$0")/.."

# The layering rules. Keep in step with the "Code map" table in ARCHITECTURE.md.
# Columns are separated by '|'; lists inside a column by spaces.
#   workspace deps allowed:   '-' for none, '*' for any workspace crate
#   external deps forbidden:  package names (a `package = "..."` rename does not hide one)
RULES='
# crate        | path         | workspace deps allowed     | external deps forbidden
protocol       | protocol/    | -                          | rusqlite bollard nix notify tokio-tungstenite hyper
agents         | agents/      | protocol                   | rusqlite bollard
agentctl       | agentctl/    | protocol                   |
supervisor     | supervisor/  | protocol agents agentctl   |
tether-tests   | tests/       | *                          |
'
# protocol knows nothing of processes, SQLite, WebSockets or Docker; agents nothing of
# SQLite or Docker.

# Dependencies the unused check skips, per crate (dependency keys as written in the crate's
# Cargo.toml). Say why on the line above each entry.
IGNORED='
# crate        | deps
'

RULES="$RULES" IGNORED="$IGNORED" python3 - <<'PY'
import glob
import json
import os
import re
import subprocess
import sys
import tomllib

ROOT = os.getcwd()
problems = []


def problem(crate, what, hint):
    problems.append(f"check-shape: {crate}: {what} ({hint})")


def table(env):
    rows = []
    for line in os.environ[env].splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        rows.append([c.strip() for c in line.split("|")])
    return rows


RULES = {}
for row in table("RULES"):
    row += [""] * (4 - len(row))
    crate, path, allowed, forbidden = row[:4]
    RULES[crate] = {
        "path": path.rstrip("/"),
        "allowed": None if allowed == "*" else set() if allowed in ("", "-") else set(allowed.split()),
        "forbidden": set(forbidden.split()),
    }
IGNORED = {}
for row in table("IGNORED"):
    IGNORED.setdefault(row[0], set()).update(row[1].split() if len(row) > 1 else [])


def load_toml(path):
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        sys.exit(f"check-shape: {path}: cannot read it: {e} (fix the manifest)")


root_manifest = load_toml("Cargo.toml")
ws = root_manifest.get("workspace", {})
ws_deps = ws.get("dependencies", {})

# Members: from cargo (it knows globs and exclusions); from the root Cargo.toml if cargo
# cannot answer.
members = {}  # package name -> crate dir relative to the root
try:
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        check=True, capture_output=True, text=True,
    ).stdout
    meta = json.loads(out)
    ids = set(meta["workspace_members"])
    for pkg in meta["packages"]:
        if pkg["id"] in ids:
            members[pkg["name"]] = os.path.relpath(os.path.dirname(pkg["manifest_path"]), ROOT)
except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
    why = getattr(e, "stderr", None) or str(e)
    lines = why.strip().splitlines() or ["no output"]
    why = next((l for l in lines if l.startswith("error")), lines[-1])
    print(f"check-shape: note: cargo metadata failed ({why}); reading members from Cargo.toml",
          file=sys.stderr)
    excluded = {os.path.normpath(p) for p in ws.get("exclude", [])}
    for pattern in ws.get("members", []):
        for d in sorted(glob.glob(pattern)):
            d = os.path.normpath(d)
            if d in excluded or not os.path.isfile(os.path.join(d, "Cargo.toml")):
                continue
            members[load_toml(os.path.join(d, "Cargo.toml"))["package"]["name"]] = d

manifests = {name: load_toml(os.path.join(d, "Cargo.toml")) for name, d in members.items()}


def lib_ident(pkg_name):
    """The identifier a dependency is named by in Rust code, when it is not renamed.
    Known for workspace crates ([lib] name); for others, the package name with '_'."""
    if pkg_name in manifests:
        lib = manifests[pkg_name].get("lib", {}).get("name")
        if lib:
            return lib
    return pkg_name.replace("-", "_")


def declared_deps(manifest):
    """Yields (key, package name, section label) for every declared dependency."""
    kinds = [("dependencies", "dependencies"), ("dev-dependencies", "dev-dependencies"),
             ("dev_dependencies", "dev-dependencies"), ("build-dependencies", "build-dependencies"),
             ("build_dependencies", "build-dependencies")]
    sources = [("", manifest)]
    for cfg, t in manifest.get("target", {}).items():
        sources.append((f"target.'{cfg}'.", t))
    for prefix, t in sources:
        for key, label in kinds:
            for dep, spec in t.get(key, {}).items():
                pkg = None
                if isinstance(spec, dict):
                    pkg = spec.get("package")
                    if spec.get("workspace") and pkg is None:
                        inherited = ws_deps.get(dep, {})
                        if isinstance(inherited, dict):
                            pkg = inherited.get("package")
                yield dep, pkg or dep, f"[{prefix}{label}]"


# ---- 1. layering ---------------------------------------------------------------------
for name in sorted(set(members) - set(RULES)):
    problem(name, f"workspace member at {members[name]}/ has no layering rule",
            "add a row to RULES in scripts/check-shape.sh and to ARCHITECTURE.md's Code map")
for name in sorted(set(RULES) - set(members)):
    problem(name, "has a layering rule but is not a workspace member",
            "remove its row from RULES in scripts/check-shape.sh, or fix the crate name")

for name in sorted(set(members) & set(RULES)):
    rule = RULES[name]
    if os.path.normpath(members[name]) != os.path.normpath(rule["path"]):
        problem(name, f"lives at {members[name]}/, RULES says {rule['path']}/",
                "move the crate or fix its path in RULES and ARCHITECTURE.md's Code map")
    for key, pkg, section in declared_deps(manifests[name]):
        if key != pkg:
            section += f" as `{key}`"
        if pkg in members:
            if pkg == name:
                continue  # a crate's dev-dependency on itself (e.g. for features) is fine
            allowed = rule["allowed"]
            if allowed is not None and pkg not in allowed:
                may = ", ".join(sorted(allowed)) or "no workspace crate"
                problem(name, f"depends on workspace crate `{pkg}` in {section}",
                        f"{name} may depend on: {may}; see RULES in scripts/check-shape.sh "
                        "and ARCHITECTURE.md's Code map")
        elif pkg in rule["forbidden"]:
            problem(name, f"depends on forbidden crate `{pkg}` in {section}",
                    f"{name} must not depend on {', '.join(sorted(rule['forbidden']))}; "
                    "move that code to a crate that may")

# ---- 2. unused dependencies ----------------------------------------------------------
COMMENT = re.compile(r"/\*(?![*!]).*?\*/|(?:^|(?<=\s))//(?![/!]).*?$", re.S | re.M)


def crate_sources(crate_dir, manifest):
    files = set()
    for sub in ("src", "tests", "benches", "examples"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(crate_dir, sub)):
            dirnames[:] = [d for d in dirnames if d != "target"]
            files.update(os.path.join(dirpath, f) for f in filenames if f.endswith(".rs"))
    build = manifest.get("package", {}).get("build", "build.rs")
    if isinstance(build, str):
        files.add(os.path.join(crate_dir, build))
    # Targets with an explicit path outside the usual directories.
    targets = [manifest.get("lib", {})]
    for kind in ("bin", "test", "bench", "example"):
        targets += manifest.get(kind, [])
    for t in targets:
        if isinstance(t, dict) and "path" in t:
            files.add(os.path.join(crate_dir, t["path"]))
    text = []
    for f in sorted(files):
        if os.path.isfile(f):
            with open(f, encoding="utf-8", errors="replace") as fh:
                text.append(COMMENT.sub("", fh.read()))
    return "\n".join(text)


checked = skipped = 0
for name in sorted(members):
    crate_dir, manifest = members[name], manifests[name]
    text = crate_sources(crate_dir, manifest)
    meta_ignored = (manifest.get("package", {}).get("metadata", {})
                    .get("check-shape", {}).get("ignored", []))
    ignored = set(IGNORED.get(name, set())) | set(meta_ignored)
    deps = {}  # key -> (package, [sections])
    for key, pkg, section in declared_deps(manifest):
        deps.setdefault(key, (pkg, []))[1].append(section)
    for ig in sorted(ignored):
        if ig not in deps and ig not in {p for p, _ in deps.values()}:
            problem(name, f"ignores `{ig}`, which it does not depend on",
                    f"drop it from [package.metadata.check-shape] in {crate_dir}/Cargo.toml "
                    "or from IGNORED in scripts/check-shape.sh")
    for key, (pkg, sections) in sorted(deps.items()):
        if key in ignored or pkg in ignored:
            skipped += 1
            continue
        checked += 1
        ident = key.replace("-", "_") if key != pkg else lib_ident(pkg)
        i = re.escape(ident)
        used = re.search(
            rf"(?<!\w)(?<!\w::)(?<!\$){i}::"      # ident::path, ::ident::path, #[ident::attr]
            rf"|\buse\s+(?:::)?{i}\b"           # use ident; use ident as x; use ::ident
            rf"|\bextern\s+crate\s+{i}\b",
            text)
        if not used:
            problem(name, f"unused dependency `{key}` in {', '.join(dict.fromkeys(sections))}",
                    f"remove it from {crate_dir}/Cargo.toml, or if it is needed without a "
                    "path use (e.g. only to enable a feature), add it to "
                    "[package.metadata.check-shape] ignored with a comment saying why")

if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"check-shape: ok ({len(members)} crates layered as in RULES, "
      f"{checked} declared dependencies used, {skipped} ignored)")
PY
