#!/usr/bin/env bash
# Both README commands on a machine that has none of qkv's packages: a fresh minimal Debian 12
# root made with mmdebstrap, the checkout copied in, then scripts/demo.sh (short training) and
# scripts/test.sh run inside it with chroot. `.ci/run` calls this, so a package that only this
# machine has can never make CI pass.
#
#   sudo scripts/check-fresh-machine.sh                # demo (1 minute of training) + the test suite
#   MINUTES=2 scripts/check-fresh-machine.sh demo      # the demo only
#   scripts/check-fresh-machine.sh test                # the test suite only
#   KEEP=1 scripts/check-fresh-machine.sh ...          # keep the root afterwards (its path is printed)
#   ROOT_PARENT=/var/tmp scripts/check-fresh-machine.sh   # where the root is made (default /tmp)
#
# Only what a fresh machine's owner would set up is carried into the root: the resolver
# (resolv.conf), the apt sources and proxy, locally added CA certificates, and npm's registry and
# CA file, so the root reaches the same registries as this machine. Nothing else: no packages, no
# build trees. The root is made anew on every run and removed at the end, mounts first, even when
# a step fails. When no root can be made the script fails; it never falls back to this machine.
# Needs root (mmdebstrap, mount, chroot); installs mmdebstrap on this machine if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
MINUTES=${MINUTES:-1}
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(demo test)
for s in "${STEPS[@]}"; do
  case "$s" in demo|test) ;; *) echo "check-fresh-machine: unknown step '$s' (expected demo and/or test)" >&2; exit 2 ;; esac
done
[ "$(id -u)" -eq 0 ] || { echo "check-fresh-machine: must run as root (mmdebstrap, mount and chroot need it)" >&2; exit 1; }

results=()
ROOT=""
start_all=$(date +%s)
report() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  cleanup
  echo
  echo "== check-fresh-machine: summary"
  for r in "${results[@]}"; do echo "  $r"; done
  echo "  total: $(( $(date +%s) - start_all )) s"
  if [ "$rc" -eq 0 ]; then echo "== check-fresh-machine: PASSED"; else echo "== check-fresh-machine: FAILED (exit $rc)"; fi
  exit "$rc"
}
cleanup() {
  [ -n "$ROOT" ] && [ -d "$ROOT" ] || return 0
  # Unmount everything below the root, deepest first, before anything is removed.
  local m
  for m in $(awk -v r="$ROOT/" 'index($2, r) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "check-fresh-machine: cannot unmount $m" >&2
  done
  if awk -v r="$ROOT/" 'index($2, r) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
    echo "check-fresh-machine: mounts remain under $ROOT; not removing it" >&2
    return 1
  fi
  if [ -n "${KEEP:-}" ]; then
    echo "check-fresh-machine: kept the root at $ROOT (KEEP=1)"
  else
    rm -rf --one-file-system "$ROOT"
  fi
}
trap report EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# step NAME CMD...: runs CMD, records its result and time; a failure ends the script.
step() {
  local name=$1; shift
  local t0 rc
  t0=$(date +%s)
  echo
  echo "== check-fresh-machine: $name"
  set +e
  "$@"
  rc=$?
  set -e
  local dt=$(( $(date +%s) - t0 ))
  if [ "$rc" -eq 0 ]; then results+=("ok      ${dt} s  $name"); else results+=("FAILED  ${dt} s  $name (exit $rc)"); fi
  return "$rc"
}

host_tools() {
  if ! command -v mmdebstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && apt-get install -y -q --no-install-recommends mmdebstrap
  fi
  command -v mmdebstrap >/dev/null || { echo "mmdebstrap is not available" >&2; return 1; }
}

# The apt sources this machine uses (deb822 .sources and one-line .list files), as mmdebstrap's
# mirror arguments: a path to an existing file is copied into the root's sources.list.d.
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && grep -qE '^[[:space:]]*(deb[[:space:]]|Types:)' "$f" && echo "$f"
  done
  return 0
}

make_root() {
  ROOT=$(mktemp -d "${ROOT_PARENT:-/tmp}/qkv-fresh.XXXXXX")
  local sources=()
  mapfile -t sources < <(apt_sources)
  [ ${#sources[@]} -gt 0 ] || sources=(http://deb.debian.org/debian)
  # apt's proxy, if this machine has one, reaches the root through mmdebstrap's apt options.
  local aptopts=()
  local line
  while IFS= read -r line; do aptopts+=(--aptopt="$line"); done < <(apt-config dump | grep -E '^Acquire::[a-z]+::Proxy ' || true)
  echo "sources: ${sources[*]}"
  mmdebstrap --variant=minbase --include=ca-certificates "${aptopts[@]}" bookworm "$ROOT" "${sources[@]}"
  [ -x "$ROOT/bin/bash" ] && [ -x "$ROOT/usr/bin/apt-get" ] || { echo "mmdebstrap made no usable root in $ROOT" >&2; return 1; }
}

prepare_root() {
  cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
  # Locally added CA certificates (a TLS-inspecting proxy's, say), then the root's own bundle.
  if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
    mkdir -p "$ROOT/usr/local/share/ca-certificates"
    cp -rL /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
    chroot "$ROOT" update-ca-certificates >/dev/null
  fi
  # npm's registry (and the CA file npm uses here) for the GPT-2 tokenizer parity test.
  if command -v npm >/dev/null; then
    local registry cafile
    registry=$(npm config get registry 2>/dev/null || true)
    cafile=$(npm config get cafile 2>/dev/null || true)
    {
      [ -n "$registry" ] && [ "$registry" != "undefined" ] && echo "registry=$registry"
      if [ -n "$cafile" ] && [ "$cafile" != "null" ] && [ "$cafile" != "undefined" ] && [ -f "$cafile" ]; then
        cp -L "$cafile" "$ROOT/etc/qkv-host-npm-ca.crt"
        echo "cafile=/etc/qkv-host-npm-ca.crt"
      fi
      echo "fund=false"
      echo "audit=false"
      echo "update-notifier=false"
    } > "$ROOT/etc/npmrc"
    echo "npmrc: $(tr '\n' ' ' < "$ROOT/etc/npmrc")"
  fi
  for d in proc sys dev; do mkdir -p "$ROOT/$d"; done
  mount -t proc proc "$ROOT/proc"
  mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys"
  mount --rbind /dev "$ROOT/dev" && mount --make-rslave "$ROOT/dev"
  # The checkout as git sees it (tracked and untracked files that are not ignored): no build trees.
  mkdir -p "$ROOT/src/qkv"
  git -C "$SRC" ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf - | tar -xf - -C "$ROOT/src/qkv"
  echo "copied $(find "$ROOT/src/qkv" -type f | wc -l) files of the checkout into $ROOT/src/qkv"
}

# in_root CMD: runs CMD in the root's checkout with a clean environment.
in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 CI="${CI:-}" MINUTES="$MINUTES" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /src/qkv && $1"
}

step "host: mmdebstrap available" host_tools
step "make a fresh minimal Debian 12 root (mmdebstrap --variant=minbase bookworm)" make_root
step "carry over resolver, apt sources, CA certificates, npm registry; mount /proc /sys /dev; copy the checkout" prepare_root
step "the root has none of qkv's packages" in_root '! command -v cmake && ! command -v g++ && ! dpkg -s libdnnl-dev >/dev/null 2>&1'
for s in "${STEPS[@]}"; do
  case "$s" in
    demo) step "README command 1: scripts/demo.sh (MINUTES=$MINUTES)" in_root 'OUT=/tmp/ende scripts/demo.sh' ;;
    test) step "README command 2: scripts/test.sh" in_root 'scripts/test.sh' ;;
  esac
done
