#!/usr/bin/env bash
# What can be tested of deploy/Dockerfile without a Docker engine or registry:
#
#   GDG_BIN=target/release/gpu-deploy-guard tests/image/run.sh   # after make build
#   GDG_IMAGE_EXACT=1 tests/image/run.sh     # build with the Dockerfile's own cargo command first
#
# 1. The Dockerfile builds on $BUILDPLATFORM, cross-compiles per TARGETARCH
#    for amd64 and arm64, and ends on distroless/cc-debian12:nonroot with
#    USER 65532:65532, the uid the chart's pods run as.
# 2. Its cargo command is `cargo auditable build --release --locked --bin
#    gpu-deploy-guard --target <triple>`, with the cargo-auditable version
#    tests/build/cargo-tool.sh pins. With GDG_IMAGE_EXACT=1 that command is
#    run here for the host's triple; otherwise GDG_BIN (from `cargo auditable
#    build --release --locked`, what `make build` runs: same profile,
#    lockfile, features and wrapper; --bin and a --target equal to the host
#    only change the output directory) is checked.
# 3. The binary needs only libraries distroless/cc provides (glibc, libgcc_s,
#    libstdc++), the glibc loader, and no glibc symbol newer than bookworm's
#    2.36.
# 4. It serves as uid/gid 65532 with no supplementary groups, from a
#    directory it cannot write, reading a certificate it can read only
#    through its group (mode 0440, group 65532, as the Secret is mounted):
#    /readyz answers 200 and a review gets an AdmissionReview back.
# 5. It carries cargo auditable's dependency list (section .dep-v0, what
#    Trivy, Grype and Syft read), and that lists exactly the crates of
#    Cargo.lock it is built from (tests/image/dep_list.py); a binary without
#    one fails.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
dockerfile=deploy/Dockerfile
die() { echo "image tests: $*" >&2; exit 2; }

passed=0 failed=0
# check [--show] NAME COMMAND...: --show prints the command's output under a pass too.
check() {
  local show=0
  [[ $1 == --show ]] && { show=1; shift; }
  local name=$1; shift
  local out line
  if out=$("$@" 2>&1); then
    passed=$((passed + 1)); echo "ok   $name"
    if ((show)); then while IFS= read -r line; do echo "     $line"; done <<<"$out"; fi
  else
    failed=$((failed + 1)); echo "FAIL $name"
    while IFS= read -r line; do echo "     $line"; done <<<"$out"
  fi
}
has() { grep -qE -- "$2" "$1" || { echo "$1 has no line matching: $2"; return 1; }; }

check "build stage runs on \$BUILDPLATFORM" has "$dockerfile" '^FROM --platform=\$BUILDPLATFORM rust:[0-9.]+-bookworm AS build$'
check "amd64 and arm64 targets with their cross toolchains" bash -c "
  grep -qE 'amd64\) triple=x86_64-unknown-linux-gnu; gnu=x86_64-linux-gnu' $dockerfile &&
  grep -qE 'arm64\) triple=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu' $dockerfile &&
  grep -q 'gcc-aarch64-linux-gnu libc6-dev-arm64-cross' $dockerfile &&
  grep -q 'rustup target add' $dockerfile"
check "final stage is distroless/cc-debian12:nonroot" has "$dockerfile" '^FROM gcr.io/distroless/cc-debian12:nonroot$'
check "runs as 65532:65532" has "$dockerfile" '^USER 65532:65532$'
check "the chart runs the pods as 65532 too" bash -c \
  "[ \"\$(grep -c 'runAsUser: 65532' deploy/helm/gpu-deploy-guard/templates/deployment.yaml)\" = 2 ]"

cargo_cmd="$(grep -oE 'cargo auditable build [^&;]+' "$dockerfile" | head -1 | sed 's/[[:space:]]*$//')"
check "the Dockerfile's cargo command" test "$cargo_cmd" = 'cargo auditable build --release --locked --bin gpu-deploy-guard --target "$RUST_TARGET"'
auditable_pin() {
  local built pinned
  pinned="$(sed -n 's/^auditable) crate=cargo-auditable version=\([0-9.]*\) ;;$/\1/p' tests/build/cargo-tool.sh)"
  built="$(sed -n 's/^ARG CARGO_AUDITABLE_VERSION=//p' "$dockerfile")"
  echo "Dockerfile: ${built:-none}, tests/build/cargo-tool.sh: ${pinned:-none}"
  [[ -n $pinned && $built == "$pinned" ]] || return 1
  grep -q '^RUN cargo install --locked cargo-auditable --version "\$CARGO_AUDITABLE_VERSION"$' "$dockerfile" ||
    { echo "no 'RUN cargo install --locked cargo-auditable --version \"\$CARGO_AUDITABLE_VERSION\"'"; return 1; }
}
check "the Dockerfile installs the cargo-auditable make build uses" auditable_pin

context_is_a_package() {
  local d line src rc=0
  d="$(mktemp -d)"
  # What the Dockerfile copies from the context (COPY without --from), each
  # source let through by the allow-list in Dockerfile.dockerignore.
  while read -r line; do
    read -r -a words <<<"$line"
    for src in "${words[@]:1:${#words[@]}-2}"; do
      if ! grep -qE "^!${src%/}/?$" deploy/Dockerfile.dockerignore; then
        echo "COPY source $src is not let through by deploy/Dockerfile.dockerignore"; rc=1
      fi
      cp -r "$src" "$d/" || rc=1
    done
  done < <(grep -E '^COPY ' "$dockerfile" | grep -v -- '--from')
  if [[ $rc == 0 ]]; then
    (cd "$d" && cargo metadata --no-deps --locked --offline --format-version 1 >/dev/null) || rc=1
  fi
  rm -rf "$d"
  return $rc
}
check "the build context (COPY sources, let through by the .dockerignore) is a whole cargo package" context_is_a_package

triple="$(rustc -vV | sed -n 's/^host: //p')"
if [[ "${GDG_IMAGE_EXACT:-}" == 1 ]]; then
  echo "== RUST_TARGET=$triple $cargo_cmd"
  auditable_dir="$(bash tests/build/cargo-tool.sh auditable)" || die "cannot install cargo-auditable"
  RUST_TARGET="$triple" PATH="$auditable_dir:$PATH" bash -c "$cargo_cmd" || die "the Dockerfile's cargo command failed"
  bin="target/$triple/release/gpu-deploy-guard"
else
  bin="${GDG_BIN:-target/release/gpu-deploy-guard}"
fi
[[ -x "$bin" ]] || die "no binary at $bin (run make build, or set GDG_BIN)"
bin="$(realpath "$bin")"
echo "== checking $bin ($triple)"

# Shared objects of distroless/cc-debian12: libc6, libgcc-s1, libstdc++6.
allowed='^(libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libutil\.so\.1|libgcc_s\.so\.1|libstdc\+\+\.so\.6|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$'
needed() {
  local libs
  libs="$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
  [[ -n "$libs" ]] || { echo "no NEEDED entries: not a dynamically linked ELF?"; return 1; }
  echo "NEEDED: $(tr '\n' ' ' <<<"$libs")"
  local bad
  bad="$(grep -vE "$allowed" <<<"$libs")" && { echo "not in distroless/cc: $bad"; return 1; }
  return 0
}
check "links only against distroless/cc's libraries" needed
check "loader is glibc's" bash -c "readelf -l '$bin' | grep -qE 'Requesting program interpreter: /lib(64)?/ld-linux-(x86-64|aarch64)\.so\.[12]'"
glibc_max() {
  local max
  max="$(objdump -T "$bin" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/GLIBC_//' | sort -V | tail -1)"
  echo "newest glibc symbol version: $max"
  [[ "$(printf '%s\n2.36\n' "$max" | sort -V | tail -1)" == 2.36 ]]
}
check "needs no glibc newer than bookworm's 2.36" glibc_max
check --show "carries cargo auditable's dependency list (.dep-v0): Cargo.lock's crates it is built from" \
  python3 tests/image/dep_list.py "$bin" "$triple"

serves_as_65532() {
  local dir pid port admin rc=1
  dir="$(mktemp -d)"
  chmod 755 "$dir"
  "$bin" certs --out "$dir" --ip 127.0.0.1 >/dev/null || return 1
  chgrp 65532 "$dir/tls.crt" "$dir/tls.key" && chmod 0440 "$dir/tls.crt" "$dir/tls.key"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  admin=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  (cd / && exec setpriv --reuid=65532 --regid=65532 --clear-groups --no-new-privs -- \
    "$bin" serve --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --tls-cert "$dir/tls.crt" --tls-key "$dir/tls.key" --no-cluster-watch --shutdown-delay 0s) >"$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  if ! grep -qE '^Uid:[[:space:]]+65532[[:space:]]+65532' "/proc/$pid/status" ||
     ! grep -qE '^Groups:[[:space:]]*$' "/proc/$pid/status"; then
    echo "process identity:"; grep -E '^(Uid|Gid|Groups):' "/proc/$pid/status"
  elif ! curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null; then
    echo "/readyz did not answer 200"
  elif ! curl -fsS --cacert "$dir/ca.crt" -H 'Content-Type: application/json' \
      --data-binary @tests/fixtures/reviews/lab-node-2-device-plugin-only.json \
      "https://127.0.0.1:$port/validate" | grep -q '"kind":"AdmissionReview"'; then
    echo "POST /validate gave no AdmissionReview"
  else
    rc=0
  fi
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  [[ $rc == 0 ]] || cat "$dir/log"
  rm -rf "$dir"
  return $rc
}
if [[ $(id -u) == 0 ]]; then
  check "serves as uid 65532, gid 65532, no supplementary groups" serves_as_65532
else
  # Switching to uid 65532 needs root; a skipped check must not count as a pass.
  failed=$((failed + 1)); echo "FAIL serves as uid 65532: needs root to switch user (run as root, as CI does)"
fi

echo "== tests/image: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
