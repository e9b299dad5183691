#!/usr/bin/env bash
# Checks that every patched crate copy under third_party/ is its published
# crates.io release plus exactly its patch file (see third_party/README.md).
#   bash third_party/verify.sh                 # check (CI)
#   bash third_party/verify.sh --write-patch   # regenerate the patch files
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# name version sha256-of-the-.crate (the checksum crates.io's index and
# Cargo.lock gave before the patch)
crates=(
  "kafka-protocol 0.18.0 099d5c2f1b40cd830cbf18ca4d2a0805f2875b811ca18f0372b2433e68fe2dda"
  "etcd-client 0.21.1 c46b85f82f5189ce66d901425833ee2d94440a571e8071252db5776cc66dea63"
)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for entry in "${crates[@]}"; do
  read -r name version sum <<<"$entry"
  crate="$work/$name-$version.crate"
  cached=$(ls ~/.cargo/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -1 || true)
  if [[ -n $cached ]]; then cp "$cached" "$crate"; else
    curl -fsSL -o "$crate" "https://static.crates.io/crates/$name/$name-$version.crate"
  fi
  got=$(sha256sum "$crate" | cut -d' ' -f1)
  if [[ $got != "$sum" ]]; then echo "$name $version: .crate checksum $got, pinned $sum"; status=1; continue; fi
  tar -xzf "$crate" -C "$work"
  orig="$work/$name-$version"
  # What the copy drops on purpose (third_party/README.md).
  rm -rf "$orig/tests" "$orig/Cargo.lock" "$orig/rust-toolchain.toml" "$orig/.github" "$orig/.gitignore" \
    "$orig/Cargo.toml.orig" "$orig/.cargo_vcs_info.json" "$orig/.cargo-ok"
  diff_out="$work/$name.patch"
  (cd "$work" && diff -ruN "$name-$version" "$here/$name" | sed "s|$here/|third_party/|") > "$diff_out" || true
  if [[ ${1:-} == --write-patch ]]; then
    cp "$diff_out" "$here/$name.patch"; echo "wrote third_party/$name.patch"
  elif ! diff -q <(grep -E '^[-+][^-+]' "$diff_out") <(grep -E '^[-+][^-+]' "$here/$name.patch") >/dev/null; then
    echo "$name $version: the copy differs from the release by more or less than $name.patch:"
    diff <(grep -E '^[-+][^-+]' "$here/$name.patch") <(grep -E '^[-+][^-+]' "$diff_out") | head -40
    status=1
  else
    echo "$name $version: published release + $name.patch ($(grep -c '^+[^+]' "$diff_out") lines added, $(grep -c '^-[^-]' "$diff_out") removed)"
  fi
done
exit $status
