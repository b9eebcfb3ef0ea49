#!/usr/bin/env bash
# Runs distlock's whole test suite on a fresh Debian machine: installs the
# server binaries the tests spawn (they start their own private instances on
# free loopback ports; the machine's own services are never used), checks
# formatting and lints, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages providing the binaries the tests spawn.
packages=()
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || packages+=(redis-tools)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || packages+=(postgresql)
command -v mariadbd >/dev/null 2>&1 || packages+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || packages+=(mariadb-client)
command -v openssl >/dev/null 2>&1 || packages+=(openssl)  # certificates for the TLS tests
command -v nft >/dev/null 2>&1 || packages+=(nftables)  # network partitions in the Postgres partition tests
command -v ip >/dev/null 2>&1 || packages+=(iproute2)
command -v script >/dev/null 2>&1 || packages+=(bsdutils)  # a terminal for the CLI's interactive-command test
command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)  # the etcd backend's tests spawn etcd
command -v etcdctl >/dev/null 2>&1 || packages+=(etcd-client)  # interop with `etcdctl lock`
command -v protoc >/dev/null 2>&1 || packages+=(protobuf-compiler)  # etcd-client's build script
# etcd-client's protos import google/protobuf/*.proto, which protoc finds only
# in libprotobuf-dev (a Recommends of protobuf-compiler, skipped below).
[ -f /usr/include/google/protobuf/descriptor.proto ] || packages+=(libprotobuf-dev)
command -v unshare >/dev/null 2>&1 || packages+=(util-linux)  # private network namespaces
command -v python3 >/dev/null 2>&1 || packages+=(python3)  # redis-py, for the Redis interop test
python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
[ -x /usr/sbin/pgbouncer ] || packages+=(pgbouncer)  # the fault suite's Postgres-behind-PgBouncer cell
# The ZooKeeper backend's tests spawn private servers from Debian's jars
# (test-servers/src/zookeeper.rs), which need a Java runtime.
[ -f /usr/share/java/zookeeper.jar ] || packages+=(zookeeper)
command -v java >/dev/null 2>&1 || packages+=(default-jre-headless)
# The deployment recipes are checked by the tools that consume them
# (deploy/README.md), and the CLI's man page by `man -l`.
command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || packages+=(systemd)
command -v man >/dev/null 2>&1 || packages+=(man-db)

if [ ${#packages[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: missing ${packages[*]}; install them with: sudo apt-get install -y ${packages[*]}" >&2
    exit 1
  fi
  echo "scripts/test.sh: installing ${packages[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

# redis-py, for the Redis interop test (a key held by its `Lock`). Debian's
# python3 refuses user installs without --break-system-packages (PEP 668).
if ! python3 -c 'import redis' >/dev/null 2>&1; then
  echo "scripts/test.sh: installing redis-py (pip install redis)" >&2
  python3 -m pip install --quiet --user redis 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages redis
fi

# kazoo, for the ZooKeeper interop test (a lock path shared with kazoo's
# `Lock`); the test installs it too if it is missing.
if ! python3 -c 'import kazoo' >/dev/null 2>&1; then
  echo "scripts/test.sh: installing kazoo (pip install kazoo)" >&2
  python3 -m pip install --quiet --user kazoo 2>/dev/null \
    || python3 -m pip install --quiet --user --break-system-packages kazoo
fi

# The build below fills about 1.9 GiB of an empty target directory (`du -sh
# target` after it; 6.2 GiB before the dev profile dropped full debug info).
# Say so up front rather than let the linker die of a full disk halfway.
target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_dir"
free_kb=$(df -Pk "$target_dir" | awk 'NR == 2 { print $4 }')
needed_kb=$((5 * 1024 * 1024 / 2))
if [ "$free_kb" -lt "$needed_kb" ]; then
  echo "scripts/test.sh: only $((free_kb / 1024)) MiB free on the filesystem of $target_dir;" \
    "the test build needs about 2.5 GiB (free space, or point CARGO_TARGET_DIR elsewhere)" >&2
  exit 1
fi
# One build, run once: incremental caches would only take disk.
export CARGO_INCREMENTAL=0

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
# The docs as docs.rs builds them: every feature, the docsrs cfg (feature
# labels through doc_cfg, a nightly feature RUSTC_BOOTSTRAP allows on
# stable), warnings denied.
RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="--cfg docsrs -D warnings" \
  cargo doc --workspace --all-features --no-deps --quiet
cargo build --examples --all-features --quiet
# The published crates package and build from their .crate files alone.
cargo publish --dry-run --allow-dirty --quiet -p distlock -p distlock-cli
# Deployment recipes, by their own tools.
promtool check rules deploy/prometheus/distlock-alerts.yml
(cd deploy/prometheus && promtool test rules distlock-alerts.test.yml)
python3 deploy/grafana/check.py
# The fault suite's quick profile (at most 8 minutes here; it prints its
# time). Built with the same features as the tests below, so the library is
# compiled once for both, and in debug, so CI compiles no release tree.
cargo build --workspace --all-features --bins --quiet
# The systemd unit, pointed at the binary just built (verify wants an
# executable ExecStart); any complaint fails the run.
unit_dir=$(mktemp -d)
sed "s|/usr/local/bin/distlock|$(cd "$target_dir" && pwd)/debug/distlock|" \
  deploy/systemd/distlock-cron.service > "$unit_dir/distlock-cron.service"
verify=$(systemd-analyze verify "$unit_dir/distlock-cron.service" 2>&1) || { echo "$verify" >&2; exit 1; }
if [ -n "$verify" ]; then echo "systemd-analyze verify: $verify" >&2; exit 1; fi
rm -r "$unit_dir"
"$target_dir/debug/distlock-faults" run --profile quick --json "$target_dir/faults-quick.json"
cargo test --workspace --all-features --no-fail-fast "$@"
