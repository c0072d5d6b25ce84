# Sourced by the shell test suites (tests/helm, tests/monitoring): `check NAME CMD...` runs CMD,
# prints "ok   NAME" or "FAIL NAME" with CMD's output indented, and counts into $passed and
# $failed; the suite ends by printing the counts and exiting non-zero when $failed is not 0.
passed=0 failed=0
check() {
  local name=$1; shift
  local out line
  if out=$("$@" 2>&1); then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    while IFS= read -r line; do echo "     $line"; done <<<"$out"
  fi
}
