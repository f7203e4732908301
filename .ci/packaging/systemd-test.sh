#!/usr/bin/env bash
# Runs config/systemd/leaderd@.service, unchanged, under a real systemd: a
# Debian bookworm rootfs (debootstrap) booted by systemd-nspawn, systemd as
# its PID 1. Two instances, leaderd@x and leaderd@y, share the SQLite file in
# the unit's state directory, each with a job that runs while it leads.
#
#  - `systemctl start leaderd@x` returns only once leaderd sent READY=1: on
#    its return /leader answers at once, and leaderd logged its start-up
#    line before systemd took the unit for active;
#  - `systemctl status` shows leaderd's STATUS= text, for the leader and for
#    the follower (which names the leader);
#  - kill -9 of leaderd@y's leaderd: systemd restarts it;
#  - the watchdog keeps leaderd@x alive past WatchdogSec, pinged every third
#    of it;
#  - `systemctl stop leaderd@x` stops its job (SIGTERM, exit 0) and releases
#    the lease: leaderd@y leads and starts its job well within one lease;
#  - the journal holds leaderd's log lines and the job's output.
#
# The binary: $LEADERD_BIN, else the one image-build.sh took out of the image
# it built (target/ci-packaging-bin/leaderd), else `cargo build --release`.
# Installs what it needs (apt); stops the container and removes its rootfs
# copy whatever happens. Run from anywhere: bash .ci/packaging/systemd-test.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=.ci/packaging/common.sh
source .ci/packaging/common.sh

readonly W=$CI_TARGET/ci-systemd-test
readonly UNIT=config/systemd/leaderd@.service
readonly ELECTION=ci

cleanup() {
    if [[ -n ${NSPAWN:-} ]] && kill -0 "$NSPAWN" 2>/dev/null; then
        # SIGTERM: nspawn asks the container's systemd to power off.
        kill -TERM "$NSPAWN"
        for _ in $(seq 100); do kill -0 "$NSPAWN" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$NSPAWN" 2>/dev/null
        wait "$NSPAWN"
    fi
    findmnt -rn -o TARGET | grep "^$W/" | sort -r | xargs -r umount -l
    rm -rf "$W"
}

# in_ct CMD...: run CMD inside the container (its mount, PID, network... namespaces).
in_ct() {
    nsenter --target "$CT" --mount --uts --ipc --net --pid -- \
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SYSTEMD_COLORS=0 SYSTEMD_PAGER= "$@"
}
# ct_http PORT PATH BODYFILE: an HTTP GET on the container's loopback.
ct_http() {
    : >"$3"
    nsenter --target "$CT" --net -- curl -s -o "$3" -w '%{http_code}' --max-time 2 \
        "http://127.0.0.1:$1$2" || true
}
prop() { in_ct systemctl show -P "$2" "leaderd@$1.service"; }
seen() {
    local i
    for i in "$@"; do
        in_ct systemctl status --no-pager --lines 0 "leaderd@$i.service" 2>&1 || true
        in_ct journalctl --no-pager -u "leaderd@$i.service" -n 30 2>&1 || true
    done
}
port() { case $1 in x) echo 9781 ;; y) echo 9782 ;; esac }
job_pids() { pgrep -x -f "sleep $(port "$1")" --ns "$CT" --nslist pid || true; }
monotonic_us() { python3 -c 'import time; print(time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)'; }

need_debs systemd-container util-linux procps curl python3 systemd
if [[ -d $W ]]; then cleanup >/dev/null 2>&1 || true; fi
mkdir -p "$W"
on_exit cleanup

if [[ -n ${LEADERD_BIN:-} ]]; then
    bin=$LEADERD_BIN
elif [[ -x $IMAGE_BIN ]]; then
    bin=$IMAGE_BIN
else
    log "cargo build --release --locked"
    cargo build --release --locked
    bin=$CI_TARGET/release/leaderd
fi
note "leaderd: $bin ($("$bin" --version), built $(date -r "$bin" '+%F %T'))"

bookworm_rootfs

log "rootfs: bookworm + $UNIT + leaderd + /etc/leaderd/{x,y}.toml"
root=$W/root
cp -a "$ROOTFS" "$root"
install -m 0755 "$bin" "$root/usr/local/bin/leaderd"
install -m 0644 "$UNIT" "$root/etc/systemd/system/leaderd@.service"
install -d "$root/etc/leaderd"
for i in x y; do
    # The job says when it starts and stops; `sleep <port>` is what
    # job_pids looks for.
    cat >"$root/etc/leaderd/$i.toml" <<TOML
[store]
kind = "sqlite"
path = "leaderd.db"
[[elections]]
name = "$ELECTION"
[http]
listen = "127.0.0.1:$(port "$i")"
[child]
command = ["/bin/sh", "-c", "trap 'echo job of $i stopping; exit 0' TERM; echo job of $i started; sleep $(port "$i") & wait"]
on_child_exit = "restart"
TOML
    chmod 0644 "$root/etc/leaderd/$i.toml"
done
echo leaderd-ci >"$root/etc/hostname"
# Nothing else that the boot would wait for.
rm -f "$root/etc/systemd/system/multi-user.target.wants/"*.timer

log "boot: systemd-nspawn --boot"
systemd-nspawn -D "$root" --boot --register=no --keep-unit --private-network \
    --console=pipe --machine=leaderd-ci </dev/null >"$W/console.log" 2>&1 &
NSPAWN=$!
CT=
for _ in $(seq 200); do
    CT=$(pgrep -P "$NSPAWN" -x systemd || true)
    [[ -n $CT ]] && break
    kill -0 "$NSPAWN" 2>/dev/null || fail "systemd-nspawn exited" "$(cat "$W/console.log")"
    sleep 0.1
done
[[ -n $CT ]] || fail "no systemd in the container" "$(cat "$W/console.log")"
# Until its private socket is there, systemctl cannot reach it.
for _ in $(seq 600); do
    state=$(timeout 60 nsenter --target "$CT" --mount --pid -- systemctl is-system-running --wait 2>&1 || true)
    [[ $state == *'Failed to connect to bus'* ]] || break
    sleep 0.1
done
note "container systemd (host PID $CT): $state"
[[ $state == running || $state == degraded ]] ||
    fail "the container's systemd did not finish booting" "$state" "$(tail -n 30 "$W/console.log")"
in_ct systemctl --version | head -n1 | sed 's/^/   /'

log "systemctl start leaderd@x: returns after READY=1"
t0=$(now)
timeout 60 nsenter --target "$CT" --mount --pid -- systemctl start leaderd@x.service ||
    fail "systemctl start leaderd@x failed" "$(seen x)"
code=$(ct_http 9781 /leader "$W/body")
note "returned after $(elapsed "$t0" "$(now)") s; /leader at once: $code"
x_started=$(now)
[[ $code == 200 ]] ||
    fail "systemctl start returned before /leader answered 200 (READY=1 not waited for?)" \
        "/leader: $code $(cat "$W/body")" "$(seen x)"
x_identity=$(json_field "$W/body" identity)
# And by the clocks: leaderd logged that it serves HTTP before systemd took
# the unit for started (for Type=simple that is the fork, before any log).
in_ct journalctl --no-pager -o cat -u leaderd@x.service >"$W/journal"
running_at=$(grep -m1 'leaderd running' "$W/journal" | cut -d' ' -f1)
active_at=$(in_ct systemctl show --timestamp=us+utc -P ActiveEnterTimestamp leaderd@x.service)
python3 - "$running_at" "$active_at" <<'PY' ||
import sys
from datetime import datetime
running = datetime.strptime(sys.argv[1], "%Y-%m-%dT%H:%M:%S.%fZ")
active = datetime.strptime(sys.argv[2], "%a %Y-%m-%d %H:%M:%S.%f UTC")
sys.exit(0 if running < active else 1)
PY
    fail "leaderd logged 'leaderd running' ($running_at) after systemd took leaderd@x as started ($active_at)" \
        "$(cat "$W/journal")"
note "'leaderd running' at $running_at, unit active at $active_at"
x_pid=$(prop x MainPID)

log "systemctl status: leaderd's STATUS= text"
status=$(in_ct systemctl status --no-pager --lines 0 leaderd@x.service || true)
printf '%s\n' "$status" | sed 's/^/   /'
grep -q 'Active: active (running)' <<<"$status" ||
    fail "leaderd@x is not running" "$status" "$(seen x)"
grep -Eq "Status: \"leader of $ELECTION \(fencing token [0-9]+\)\"" <<<"$status" ||
    fail "systemctl status leaderd@x does not show the leader's status text" "$status"

log "leaderd@y: a follower naming leaderd@x"
timeout 60 nsenter --target "$CT" --mount --pid -- systemctl start leaderd@y.service ||
    fail "systemctl start leaderd@y failed" "$(seen y)"
code=$(ct_http 9782 /leader "$W/body")
[[ $code == 503 && $(json_field "$W/body" leader) == "$x_identity" ]] ||
    fail "leaderd@y must answer 503 naming $x_identity" "$code $(cat "$W/body")" "$(seen y)"
status=$(in_ct systemctl status --no-pager --lines 0 leaderd@y.service || true)
grep -q 'Active: active (running)' <<<"$status" ||
    fail "leaderd@y is not running" "$status" "$(seen y)"
grep -q "Status: \"follower of $ELECTION (leader: $x_identity)\"" <<<"$status" ||
    fail "systemctl status leaderd@y does not show the follower's status text" "$status"
note "503, leader $x_identity; $(grep -o 'Status: .*' <<<"$status")"
[[ -n $(job_pids x) && -z $(job_pids y) ]] ||
    fail "the job must run under leaderd@x only" "x: $(job_pids x)" "y: $(job_pids y)"

log "kill -9 of leaderd@y's leaderd: systemd restarts it"
y_pid=$(prop y MainPID)
in_ct sh -c "kill -9 $y_pid"
for _ in $(seq 300); do
    [[ $(prop y NRestarts) == 1 && $(prop y ActiveState) == active ]] && break
    sleep 0.1
done
[[ $(prop y NRestarts) == 1 && $(prop y ActiveState) == active && $(prop y MainPID) != "$y_pid" ]] ||
    fail "leaderd@y was not restarted after kill -9 (pid $y_pid)" "$(seen y)"
in_ct journalctl --no-pager -o cat -u leaderd@y.service >"$W/journal"
grep -q 'Main process exited, code=killed, status=9/KILL' "$W/journal" ||
    fail "the journal lacks the kill" "$(cat "$W/journal")"
code=$(ct_http 9782 /leader "$W/body")
[[ $code == 503 ]] || fail "the restarted leaderd@y must follow again" "$code $(cat "$W/body")" "$(seen y)"
note "restarted: pid $y_pid -> $(prop y MainPID), NRestarts=1, follows again"

log "the watchdog: leaderd@x alive past WatchdogSec, pinging all along"
# systemd kills a unit whose last ping (or start) is WatchdogSec old; leaderd
# pings every third of it. So: alive past 1.2 x WatchdogSec with the same
# pid, at least three pings seen, none two-thirds of WatchdogSec after the
# one before, the last one recent.
wd=$(prop x WatchdogUSec)
wd_us=$(systemd-analyze timespan "$wd" | awk '$1 == "μs:" { print $2 }')
((wd_us > 0)) || fail "leaderd@.service sets no WatchdogSec" "WatchdogUSec=$wd"
until_s=$(python3 -c 'import sys; print(float(sys.argv[1]) + 1.2 * int(sys.argv[2]) / 1e6)' "$x_started" "$wd_us")
note "WatchdogSec=$wd: watching until $(elapsed "$x_started" "$until_s") s after the start"
pings=()
while lt "$(now)" "$until_s"; do
    [[ $(prop x ActiveState) == active && $(prop x MainPID) == "$x_pid" ]] ||
        fail "leaderd@x did not stay up under the watchdog" "$(seen x)"
    ping=$(prop x WatchdogTimestampMonotonic)
    ((${#pings[@]} && pings[-1] == ping)) || pings+=("$ping")
    sleep 0.5
done
last_ping=${pings[-1]}
age_us=$(($(monotonic_us) - last_ping))
[[ $(prop x NRestarts) == 0 && $(prop x MainPID) == "$x_pid" ]] ||
    fail "leaderd@x was restarted" "$(seen x)"
((${#pings[@]} >= 3)) ||
    fail "leaderd@x pinged the watchdog ${#pings[@]} times in 1.2 x WatchdogSec (expected one every third)" \
        "WatchdogTimestampMonotonic: ${pings[*]}" "$(seen x)"
for ((i = 1; i < ${#pings[@]}; i++)); do
    ((pings[i] - pings[i - 1] < wd_us * 2 / 3)) ||
        fail "leaderd@x's watchdog pings are $(((pings[i] - pings[i - 1]) / 1000)) ms apart, WatchdogSec is $((wd_us / 1000)) ms" \
            "WatchdogTimestampMonotonic: ${pings[*]}"
done
((last_ping > 0 && age_us < wd_us * 2 / 3)) ||
    fail "leaderd@x's last watchdog ping is ${age_us} us old, WatchdogSec is ${wd_us} us" "$(seen x)"
! in_ct journalctl --no-pager -u leaderd@x.service | grep -i 'watchdog timeout' ||
    fail "the journal has a watchdog timeout" "$(seen x)"
note "same pid $x_pid, NRestarts=0, ${#pings[@]} pings seen, the last $((age_us / 1000)) ms ago"

log "systemctl stop leaderd@x: the job stops, the lease goes to leaderd@y"
x_jobs=$(job_pids x)
t0=$(now)
timeout 60 nsenter --target "$CT" --mount --pid -- systemctl stop leaderd@x.service ||
    fail "systemctl stop leaderd@x failed" "$(seen x)"
note "stop took $(elapsed "$t0" "$(now)") s"
[[ $(prop x ActiveState) == inactive && $(prop x Result) == success ]] ||
    fail "leaderd@x did not stop cleanly" "$(prop x ActiveState) $(prop x Result)" "$(seen x)"
[[ -z $(job_pids x) ]] || fail "leaderd@x's job is still running" "$(job_pids x)"
in_ct journalctl --no-pager -o cat -u leaderd@x.service >"$W/journal"
grep -q 'job of x stopping' "$W/journal" || fail "leaderd@x's job got no SIGTERM" "$(cat "$W/journal")"
# Released, not run out: leaderd@y leads well within one lease (10 s).
while [[ $(ct_http 9782 /leader "$W/body") != 200 ]]; do
    lt "$(elapsed "$t0" "$(now)")" 3 ||
        fail "leaderd@y does not lead 3 s after the stop of leaderd@x (lease not released?)" \
            "$(cat "$W/body")" "$(seen x y)"
    sleep 0.05
done
note "leaderd@y leads $(elapsed "$t0" "$(now)") s after systemctl stop began (job of x was $x_jobs)"
for _ in $(seq 60); do [[ -n $(job_pids y) ]] && break; sleep 0.05; done
[[ -n $(job_pids y) ]] || fail "leaderd@y's job did not start" "$(seen y)"
# STATUS= is a datagram that leaderd's notify task sends when the state
# changes and systemd reads in its own time: it follows /leader, never
# precedes it. Give it a second.
t1=$(now)
while :; do
    status=$(in_ct systemctl status --no-pager --lines 0 leaderd@y.service || true)
    grep -Eq "Status: \"leader of $ELECTION \(fencing token [0-9]+\)\"" <<<"$status" && break
    lt "$(elapsed "$t1" "$(now)")" 1 ||
        fail "systemctl status leaderd@y does not show it leads 1 s after it leads" "$status"
    sleep 0.05
done
note "systemctl status shows it leads $(elapsed "$t1" "$(now)") s after the job started"

log "the journal holds leaderd's log lines"
for line in 'leaderd running' 'became leader' 'child started' 'job of x started' \
    'shutting down: forwarding the signal to the child' 'leaderd stopped'; do
    grep -q "$line" "$W/journal" || fail "the journal of leaderd@x lacks '$line'" "$(cat "$W/journal")"
done
note "$(grep -c . "$W/journal") lines for leaderd@x, e.g.:"
grep -m3 -E 'became leader|child started|leaderd stopped' "$W/journal" | sed 's/^/     /'

log "systemd test passed"
