#!/usr/bin/env python3
"""The dependency list cargo auditable embeds in a binary, checked against Cargo.lock.

    tests/image/dep_list.py BINARY TRIPLE

cargo auditable writes zlib-compressed JSON (auditable-serde's schema: "packages", each with
name, version, source, optional kind "build", dependencies as indices, root on the crate itself)
into the ELF section .dep-v0; Trivy, Grype and Syft read it when they scan the image. Checks:

- the section is there (a binary from a plain `cargo build` has none: that fails, not skips);
- every package in it is one of Cargo.lock's, same name, version and kind of source;
- the root is gpu-deploy-guard at Cargo.toml's version, and every dependency index points at a
  package;
- it lists exactly the packages `cargo metadata --filter-platform TRIPLE` says the binary is
  built from: the crate's normal and build dependencies and theirs, not its dev-dependencies.

Names every missing or extra crate; prints how many it found. Exit 0 when all hold, 1 if not.
"""

import json
import struct
import subprocess
import sys
import tomllib
import zlib

SECTION = ".dep-v0"
ROOT = "gpu-deploy-guard"


def elf_section(path, wanted):
    """The bytes of the ELF section named `wanted`, or None when the binary has none."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    is64 = data[4] == 2
    end = "<" if data[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(end + "Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)
    else:
        shoff, = struct.unpack_from(end + "I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(end + "HHH", data, 0x2E)

    def header(i):
        at = shoff + i * shentsize
        if is64:
            name, _type, _flags, _addr, offset, size = struct.unpack_from(end + "IIQQQQ", data, at)
        else:
            name, _type, _flags, _addr, offset, size = struct.unpack_from(end + "IIIIII", data, at)
        return name, offset, size

    _, str_off, str_size = header(shstrndx)
    names = data[str_off:str_off + str_size]
    for i in range(shnum):
        name, offset, size = header(i)
        if names[name:names.index(b"\0", name)].decode() == wanted:
            return data[offset:offset + size]
    return None


def source_kind(lock_source):
    """Cargo.lock's `source` as auditable-serde names it."""
    if lock_source is None:
        return "local"
    if lock_source in ("registry+https://github.com/rust-lang/crates.io-index",
                       "sparse+https://index.crates.io/"):
        return "crates.io"
    if lock_source.startswith("git+"):
        return "git"
    if lock_source.startswith(("registry+", "sparse+")):
        return "registry"
    return lock_source


def built_from(metadata):
    """(name, version) of every package the root is built from: normal and build edges only."""
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    packages = {p["id"]: p for p in metadata["packages"]}
    root = next(p["id"] for p in metadata["packages"]
                if p["name"] == ROOT and p["source"] is None)
    seen, todo = {root}, [root]
    while todo:
        for dep in nodes[todo.pop()]["deps"]:
            # dep_kinds' kind: null (normal), "build" or "dev"; a dependency both normal and dev counts.
            if any(k["kind"] in (None, "build") for k in dep["dep_kinds"]) and dep["pkg"] not in seen:
                seen.add(dep["pkg"])
                todo.append(dep["pkg"])
    return {(packages[i]["name"], packages[i]["version"]) for i in seen}


def problems(embedded, lock, metadata):
    """What is wrong with the embedded list `embedded`, as lines; none when it is right."""
    out = []
    listed = embedded.get("packages") or []
    locked = {(p["name"], p["version"]): source_kind(p.get("source")) for p in lock["package"]}
    extra = sorted(f"{p['name']} {p['version']} ({p.get('source')})" for p in listed
                   if locked.get((p["name"], p["version"])) != p.get("source"))
    if extra:
        out.append(f"{len(extra)} not in Cargo.lock (name, version and source): " + ", ".join(extra))
    roots = [p for p in listed if p.get("root")]
    version = next(p["version"] for p in lock["package"] if p["name"] == ROOT and "source" not in p)
    if [(p["name"], p["version"]) for p in roots] != [(ROOT, version)]:
        out.append(f"the root should be {ROOT} {version} alone, is: "
                   + (", ".join(f"{p['name']} {p['version']}" for p in roots) or "none"))
    bad = sorted({p["name"] for p in listed
                  for i in p.get("dependencies", []) if not 0 <= i < len(listed)})
    if bad:
        out.append("dependency indices out of range in: " + ", ".join(bad))
    have = {(p["name"], p["version"]) for p in listed}
    want = built_from(metadata)
    missing = sorted(f"{n} {v}" for n, v in want - have)
    if missing:
        out.append(f"{len(missing)} the binary is built from (cargo metadata) not listed: " + ", ".join(missing))
    unbuilt = sorted(f"{n} {v}" for n, v in have - want)
    if unbuilt:
        out.append(f"{len(unbuilt)} listed that the binary is not built from (cargo metadata): "
                   + ", ".join(unbuilt))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    binary, triple = sys.argv[1:]
    raw = elf_section(binary, SECTION)
    if raw is None:
        print(f"{binary} has no {SECTION} section: not built with cargo auditable "
              "(make build, or deploy/Dockerfile's cargo command)")
        return 1
    try:
        embedded = json.loads(zlib.decompress(raw))
    except (zlib.error, ValueError) as e:
        print(f"{binary}: {SECTION} is not zlib-compressed JSON: {e}")
        return 1
    with open("Cargo.lock", "rb") as f:
        lock = tomllib.load(f)
    metadata = json.loads(subprocess.run(
        ["cargo", "metadata", "--locked", "--offline", "--format-version", "1",
         "--filter-platform", triple],
        check=True, capture_output=True, text=True).stdout)
    found = problems(embedded, lock, metadata)
    listed = embedded.get("packages") or []
    build_only = sum(1 for p in listed if p.get("kind") == "build")
    for line in found:
        print(line)
    print(f"{SECTION}: {len(listed)} crates ({build_only} build-time only) of Cargo.lock's "
          f"{len(lock['package'])}, root {ROOT}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
