#!/usr/bin/env bash
# `make rock`: a versioned rockspec and a source rock of the Lua module.
#
#   tools/make-rock.sh [OUTDIR]      (default dist/)
#
# rockspecs/llmretry-scm-1.rockspec stays the development rockspec (`luarocks
# make` from a checkout). This writes OUTDIR/llmretry-V-1.rockspec from it,
# with V = LLMRETRY_VERSION of core/include/llmretry.h, the one version, and
# its source a tarball of what the build needs (llmretry-V.tar.gz beside it),
# then `luarocks pack` makes OUTDIR/llmretry-V-1.src.rock: the rockspec and
# the tarball in one file, built anywhere with `luarocks build FILE.src.rock`
# (luarocks reads the bundled tarball, not the URL). The URL is this
# machine's path because luarocks pack only fetches from a URL; once the
# project has a public home, a release tarball's URL belongs there.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$repo/dist}" && cd "${1:-$repo/dist}" && pwd)"
version="$(sed -n 's/^#define LLMRETRY_VERSION "\([^"]*\)"$/\1/p' "$repo/core/include/llmretry.h")"
[ -n "$version" ] || { echo "make-rock: LLMRETRY_VERSION not found" >&2; exit 1; }
command -v luarocks >/dev/null || { echo "make-rock: luarocks is not installed (make test-lua installs it)" >&2; exit 1; }

name="llmretry-$version"
# What the builtin build reads: the core, the Lua binding, the Lua modules.
# Named file by file rather than by folder: a `luarocks make` running beside
# this (make test's other lane) writes its objects into core/src, and tar
# fails on a folder that changes while it reads it.
files="$(mktemp)"
trap 'rm -f "$files"' EXIT
(cd "$repo" && find core bindings/lua lua rockspecs -type f ! -name '*.o' ! -name '*.so' \
   && echo README.md && echo CHANGELOG.md) | LC_ALL=C sort > "$files"
tar -C "$repo" -czf "$out/$name.tar.gz" --transform "s,^,$name/," --files-from="$files"

spec="$out/$name-1.rockspec"
{ echo "-- Made by tools/make-rock.sh from rockspecs/llmretry-scm-1.rockspec: build it"
  echo "-- with \`luarocks build $name-1.src.rock\` (the rock bundles the source)."
  sed -e "s/^version = \"scm-1\"$/version = \"$version-1\"/" \
    -e "s|^   url = \"git+file:///dev/null/llmretry.git\".*|   url = \"file://$out/$name.tar.gz\",\\n   dir = \"$name\",|" \
    "$repo/rockspecs/llmretry-scm-1.rockspec"; } > "$spec"
grep -q "^version = \"$version-1\"$" "$spec" && grep -q "dir = \"$name\"" "$spec" \
  || { echo "make-rock: rockspecs/llmretry-scm-1.rockspec no longer has the version/url lines this script rewrites" >&2; exit 1; }

(cd "$out" && luarocks pack "$spec" >/dev/null)
echo "make-rock: $spec"
echo "make-rock: $out/$name-1.src.rock"
