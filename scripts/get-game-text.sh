#!/usr/bin/env bash
# More English-German sentences for the main job: the German translations of free games' story
# text (dialogue, narration, item and unit descriptions), as the compiled gettext catalogs (.mo)
# in Debian 12's packages of Battle for Wesnoth's campaigns, Cataclysm: Dark Days Ahead, FreeDink
# and FreedroidRPG. The packages are fetched with `apt-get download` (about 580 MB, checked by apt
# against the archive's signatures), not installed: their German catalogs (*/de/LC_MESSAGES/*.mo,
# about 8 MB) are copied into DIR as PACKAGE--NAME.mo and the packages deleted. `qkv data gettext
# --out FILE DIR/*.mo` turns the catalogs into sentence pairs.
#
#   scripts/get-game-text.sh DIR
# Idempotent: does nothing when DIR already holds a complete set (DIR/SOURCES lists the packages).
set -euo pipefail
DIR=${1:?usage: scripts/get-game-text.sh DIR}
PACKAGES=(
  wesnoth-1.16-data                                                        # units, help, tutorial, multiplayer
  wesnoth-1.16-did wesnoth-1.16-dm wesnoth-1.16-dw wesnoth-1.16-ei wesnoth-1.16-httt wesnoth-1.16-l
  wesnoth-1.16-low wesnoth-1.16-nr wesnoth-1.16-sof wesnoth-1.16-sota wesnoth-1.16-sotbe wesnoth-1.16-thot
  wesnoth-1.16-trow wesnoth-1.16-tsg wesnoth-1.16-ttb wesnoth-1.16-utbs   # Wesnoth's campaigns
  cataclysm-dda-data        # Cataclysm: Dark Days Ahead: item, creature and place descriptions, dialogue
  freedink-data             # Dink Smallwood's dialogue
  freedroidrpg-data         # FreedroidRPG's dialogue
)
me=get-game-text
if [ -f "$DIR/SOURCES" ]; then
  echo "$me: $DIR already holds $(ls "$DIR"/*.mo | wc -l) catalogs"
  exit 0
fi
[ ! -e "$DIR" ] || { echo "$me: $DIR exists but holds no complete set (no $DIR/SOURCES); remove it first" >&2; exit 1; }

mkdir -p "$(dirname "$DIR")"
work=$(mktemp -d "${DIR%/}.partial.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd_download() { (cd "$work" && apt-get download "${PACKAGES[@]}" >"$work/apt.log" 2>&1); }
if ! cd_download; then
  # apt's package lists may be missing (a machine that never ran apt-get update): update them once
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "$me: apt-get download failed ($(grep -m1 '^E:' "$work/apt.log" || tail -1 "$work/apt.log")); running apt-get update"
  $SUDO apt-get update -q >/dev/null
  cd_download || { echo "$me: apt-get download ${PACKAGES[*]} failed:" >&2; cat "$work/apt.log" >&2; exit 1; }
fi
mkdir "$work/out"
for deb in "$work"/*.deb; do
  pkg=$(dpkg-deb -f "$deb" Package)
  rm -rf "$work/x" && mkdir "$work/x"
  # each package's German catalogs, wherever it keeps its locale tree; the package's name in front
  # keeps two packages' catalogs of one name apart
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work/x" --wildcards '*/de/LC_MESSAGES/*.mo'
  while IFS= read -r -d '' mo; do
    mv "$mo" "$work/out/$pkg--$(basename "$mo")"
  done < <(find "$work/x" -name '*.mo' -print0)
  echo "$pkg $(dpkg-deb -f "$deb" Version)" >>"$work/SOURCES"
  rm "$deb"
done
n=$(ls "$work/out" | wc -l)
[ "$n" -gt 0 ] || { echo "$me: no German catalog in the packages" >&2; exit 1; }
mv "$work/SOURCES" "$work/out/SOURCES"
mv "$work/out" "$DIR"
echo "$me: $n German catalogs from ${#PACKAGES[@]} packages in $DIR"
