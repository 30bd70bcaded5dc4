# Sourced by bench/pools.sh and bench/soak.sh: installs the Redis tools they drive when they
# are missing, and builds the release binary they run.
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
cargo build --release --quiet
