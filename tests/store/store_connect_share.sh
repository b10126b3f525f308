#!/usr/bin/env bash
# Each resolved address of the store's host gets its share of the connect deadline: runs
# prog_store_connect_share (see there) in a new user, mount and network namespace where
# /etc/hosts gives "twoaddr" two loopback addresses. Exits 77 (skipped) where the namespace,
# the bind mount or nftables cannot be had.
# Usage: store_connect_share.sh PROG
set -u
PROG=$1
if [ -z "${MT_SHARE_INNER:-}" ]; then
    unshare -rnm true 2>/dev/null || { echo "skipped: cannot create user/mount/net namespaces"; exit 77; }
    MT_SHARE_INNER=1 exec unshare -rnm bash "$0" "$@"
fi
hosts=$(mktemp)
trap 'rm -f "$hosts"' EXIT
printf '127.0.0.1 twoaddr\n127.0.0.2 twoaddr\n' >"$hosts"
mount --bind "$hosts" /etc/hosts || { echo "skipped: cannot bind-mount /etc/hosts"; exit 77; }
ip link set lo up || { echo "skipped: cannot bring up loopback"; exit 77; }
if ! command -v nft >/dev/null || ! nft add table inet cut ||
    ! nft add chain inet cut out '{ type filter hook output priority 0; }'; then
    echo "skipped: nftables is not usable here"
    exit 77
fi
"$PROG"
