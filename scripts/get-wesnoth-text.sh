#!/usr/bin/env bash
# More English-German sentences for the main job: the German translations of Battle for
# Wesnoth's campaigns and unit descriptions (story dialogue and narration, about 12,000 messages),
# as compiled gettext catalogs (.mo) from Debian 12's wesnoth-1.16-* packages. The packages are
# fetched with `apt-get download` (about 290 MB, checked by apt against the archive's signatures),
# not installed: their locale/de/LC_MESSAGES/*.mo files are copied into DIR and the packages
# deleted. `qkv data gettext --out FILE DIR/*.mo` turns the catalogs into sentence pairs.
#
#   scripts/get-wesnoth-text.sh DIR
# Idempotent: does nothing when DIR already holds a complete set (DIR/SOURCES lists the packages).
set -euo pipefail
DIR=${1:?usage: scripts/get-wesnoth-text.sh DIR}
PACKAGES=(
  wesnoth-1.16-data                                                        # units, help, tutorial, multiplayer
  wesnoth-1.16-did wesnoth-1.16-dm wesnoth-1.16-dw wesnoth-1.16-ei wesnoth-1.16-httt wesnoth-1.16-l
  wesnoth-1.16-low wesnoth-1.16-nr wesnoth-1.16-sof wesnoth-1.16-sota wesnoth-1.16-sotbe wesnoth-1.16-thot
  wesnoth-1.16-trow wesnoth-1.16-tsg wesnoth-1.16-ttb wesnoth-1.16-utbs   # the campaigns
)
if [ -f "$DIR/SOURCES" ]; then
  echo "get-wesnoth-text: $DIR already holds $(ls "$DIR"/*.mo | wc -l) catalogs"
  exit 0
fi
[ ! -e "$DIR" ] || { echo "get-wesnoth-text: $DIR exists but holds no complete set (no $DIR/SOURCES); remove it first" >&2; exit 1; }

mkdir -p "$(dirname "$DIR")"
work=$(mktemp -d "${DIR%/}.partial.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd_download() { (cd "$work" && apt-get download "${PACKAGES[@]}" >"$work/apt.log" 2>&1); }
if ! cd_download; then
  # apt's package lists may be missing (a machine that never ran apt-get update): update them once
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "get-wesnoth-text: apt-get download failed ($(grep -m1 '^E:' "$work/apt.log" || tail -1 "$work/apt.log")); running apt-get update"
  $SUDO apt-get update -q >/dev/null
  cd_download || { echo "get-wesnoth-text: apt-get download ${PACKAGES[*]} failed:" >&2; cat "$work/apt.log" >&2; exit 1; }
fi
mkdir "$work/mo"
for deb in "$work"/*.deb; do
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work/mo" --wildcards '*/locale/de/LC_MESSAGES/*.mo'
  echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >>"$work/SOURCES"
done
mkdir "$work/out"
find "$work/mo" -name '*.mo' -exec mv -t "$work/out" {} +
n=$(ls "$work/out" | wc -l)
[ "$n" -gt 0 ] || { echo "get-wesnoth-text: no German catalog in the packages" >&2; exit 1; }
mv "$work/SOURCES" "$work/out/SOURCES"
mv "$work/out" "$DIR"
echo "get-wesnoth-text: $n German catalogs from ${#PACKAGES[@]} packages in $DIR"
