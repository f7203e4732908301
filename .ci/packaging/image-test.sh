#!/usr/bin/env bash
# Runs the container image that image-build.sh built from the Dockerfile,
# with podman, as users run it (read-only root, no capabilities):
#
#  - the final stage holds the binary, the CA certificates and the state
#    directory only (the image's file list), and its size is printed;
#  - leaderd runs as uid/gid 65532, /leader answers, /healthz is 200, its
#    log reaches `podman logs`;
#  - two containers on one volume (the SQLite file): one leads, the other
#    answers 503 naming it; `podman stop` of the leader hands over in under a
#    second and the stopped container exits 0;
#  - the Helm chart's wrapper pattern: two init containers copy the binary
#    out of the image into an app image, whose command becomes
#    `leaderd run -- <app command>`; the app runs in the leading container
#    only, and moves when that one stops.
#
# The app image of the wrapper test is a static busybox on scratch.
#
# Builds the image first (image-build.sh) unless `--saved` says to run the
# one the last build saved (.ci/run builds it in the background while the
# tests run). Installs what it needs (apt); cleans up every container, image,
# volume and mount it made, whatever happens: all podman state lives in a
# private storage root under target/, removed at exit.
# Run from anywhere, as root: bash .ci/packaging/image-test.sh [--saved]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=.ci/packaging/common.sh
source .ci/packaging/common.sh

W=$CI_TARGET/ci-image-test
readonly W
readonly APP=localhost/leaderd-ci/app:stand-in

# As the Helm chart runs it: read-only root, every capability dropped, no
# privilege escalation. Host network so that the tests reach it on loopback
# (no bridge is created); explicit ulimits because this sandbox cannot raise
# them.
readonly -a RUN=(--network host --read-only --cap-drop all
    --security-opt no-new-privileges --log-driver k8s-file
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)

# What a failing check shows of a container.
seen() {
    local c
    for c in "$@"; do
        echo "[$c] $(pod inspect -f '{{.State.Status}}, exit code {{.State.ExitCode}}' "$c" 2>&1)"
        pod logs --tail 25 "$c" 2>&1 | sed "s/^/[$c] /"
    done
}

# wait_code URL CODE SECONDS CONTAINER...: poll URL until it answers CODE,
# while the first CONTAINER runs.
wait_code() {
    local url=$1 want=$2 secs=$3 got deadline
    shift 3
    deadline=$(($(date +%s) + secs))
    while got=$(http_get "$url" "$W/body"); [[ $got != "$want" ]]; do
        if (($(date +%s) >= deadline)) || [[ $(pod inspect -f '{{.State.Running}}' "$1") != true ]]; then
            fail "$url: expected $want within ${secs}s, got $got" "$(cat "$W/body" 2>/dev/null)" "$(seen "$@")"
        fi
        sleep 0.05
    done
}

# running_as CONTAINER UID: every process of the container runs as UID:UID.
running_as() {
    local c=$1 want=$2 pid p ids
    pid=$(pod inspect -f '{{.State.Pid}}' "$c")
    for p in "$pid" $(pgrep -P "$pid"); do
        ids="$(awk '/^Uid:/ { print $2 }' "/proc/$p/status"):$(awk '/^Gid:/ { print $2 }' "/proc/$p/status")"
        [[ $ids == "$want:$want" ]] ||
            fail "$c: process $p runs as uid:gid $ids, not $want:$want" \
                "$(ps -o pid,user,group,args -p "$pid" --ppid "$pid")"
    done
}

# job_running CONTAINER: whether the wrapper test's job runs in CONTAINER.
job_running() {
    local pid
    pid=$(pod inspect -f '{{.State.Pid}}' "$1")
    [[ $pid != 0 ]] && pgrep -f -x 'sleep 6001' --ns "$pid" --nslist pid >/dev/null
}

case ${1:-} in
'') bash .ci/packaging/image-build.sh ;;
--saved) ;;
*)
    echo "usage: $0 [--saved]" >&2
    exit 64
    ;;
esac
need_debs "${IMAGE_DEBS[@]}"
[[ -f $IMAGE_ARCHIVE ]] ||
    fail "no image at $IMAGE_ARCHIVE: bash .ci/packaging/image-build.sh makes it"
# Leftovers of a run that was killed before its cleanup.
if [[ -d $W ]]; then
    storage_cleanup >/dev/null 2>&1 || true
fi
mkdir -p "$W/libpod"
on_exit storage_cleanup

log "podman load: the image image-build.sh saved at $(date -r "$IMAGE_ARCHIVE" '+%F %T')"
pod load --quiet -i "$IMAGE_ARCHIVE" >/dev/null
pod image exists "$IMAGE" || fail "$IMAGE_ARCHIVE does not hold $IMAGE" "$(pod images 2>&1)"

log "app stand-in $APP: a static busybox on scratch"
app=$W/app-context
mkdir -p "$app"
cp /bin/busybox "$app/busybox"
printf '%s\n' 'FROM scratch' 'COPY busybox /bin/busybox' \
    'RUN ["/bin/busybox", "--install", "-s", "/bin"]' >"$app/Containerfile"
bah build --quiet --isolation chroot --pull=never -t "$APP" "$app" >/dev/null

log "the image: size, files, configuration"
size=$(pod image inspect -f '{{.Size}}' "$IMAGE")
mnt=$(pod image mount "$IMAGE")
binsize=$(stat -c %s "$mnt/usr/local/bin/leaderd")
note "image size: $size bytes ($((size / 1024)) KiB); the binary: $binsize bytes"
files=$(cd "$mnt" && find . -mindepth 1 -printf '%M %U:%G %p\n' | sort -k3)
printf '%s\n' "$files" | sed 's/^/   /'
certs=$(grep -c 'BEGIN CERTIFICATE' "$mnt/etc/ssl/certs/ca-certificates.crt" || true)
pod image unmount "$IMAGE" >/dev/null
config=$(pod image inspect -f 'user={{.Config.User}} entrypoint={{.Config.Entrypoint}} workdir={{.Config.WorkingDir}}' "$IMAGE")
note "$config; $certs CA certificates"
# Asserted at the end: first what a user would run into.

log "one container: non-root, /leader, /healthz, logs"
pa=$(free_port)
pb=$(free_port)
pod volume create leaderd-ci-state >/dev/null
start_leaderd() { # NAME PORT
    pod run -d --name "$1" --hostname "$1" "${RUN[@]}" \
        -v leaderd-ci-state:/var/lib/leaderd "$IMAGE" \
        run --election ci --listen "127.0.0.1:$2" >"$W/run.log" 2>&1 ||
        fail "podman run $IMAGE ($1) failed" "$(cat "$W/run.log")"
}
start_leaderd leaderd-a "$pa"
wait_code "http://127.0.0.1:$pa/leader" 200 20 leaderd-a
a_identity=$(json_field "$W/body" identity)
note "leaderd-a leads as $a_identity"
running_as leaderd-a 65532
note "every process of leaderd-a runs as 65532:65532"
[[ $(http_get "http://127.0.0.1:$pa/healthz" "$W/body") == 200 ]] ||
    fail "/healthz of leaderd-a is not 200" "$(cat "$W/body")" "$(seen leaderd-a)"
# leaderd logs to stderr (its stdout is for command output such as lock
# tokens); what counts in a container is that the runtime collects it.
pod logs leaderd-a >"$W/logs" 2>&1
{ grep -q 'leaderd running' "$W/logs" && grep -q 'became leader' "$W/logs"; } ||
    fail "podman logs leaderd-a lacks leaderd's log lines" "$(cat "$W/logs")"
note "podman logs: $(grep -c . "$W/logs") lines, e.g. $(grep -m1 'became leader' "$W/logs")"

log "two containers, one SQLite volume: one leads, the other names it"
start_leaderd leaderd-b "$pb"
wait_code "http://127.0.0.1:$pb/leader" 503 20 leaderd-b
b_says=$(json_field "$W/body" leader)
[[ $b_says == "$a_identity" ]] ||
    fail "leaderd-b must name $a_identity as leader" "$(cat "$W/body")" "$(seen leaderd-a leaderd-b)"
note "leaderd-b: 503, leader $b_says"

log "podman stop leaderd-a: leaderd-b leads in under a second"
t0=$(now)
pod stop --time 10 leaderd-a >"$W/stop.log" 2>&1 &
stopper=$!
on_exit "kill $stopper"
while [[ $(http_get "http://127.0.0.1:$pb/leader" "$W/body") != 200 ]]; do
    lt "$(elapsed "$t0" "$(now)")" 5 || fail "leaderd-b does not lead 5 s after podman stop" \
        "$(cat "$W/body")" "$(seen leaderd-a leaderd-b)"
    sleep 0.02
done
handover=$(elapsed "$t0" "$(now)")
wait "$stopper" || fail "podman stop leaderd-a failed" "$(cat "$W/stop.log")"
note "leaderd-b leads $handover s after podman stop"
lt "$handover" 1 || fail "handover took $handover s (podman stop to the follower leading), not under 1 s" \
    "$(seen leaderd-a leaderd-b)"
code=$(pod inspect -f '{{.State.ExitCode}}' leaderd-a)
[[ $code == 0 ]] || fail "the stopped leader exited $code, not 0" "$(seen leaderd-a)"
note "leaderd-a exited 0"
pod rm --force --time 0 leaderd-a leaderd-b >/dev/null

log "wrapper pattern: the binary copied into an app image runs the app on the leader only"
cat >"$W/leaderd.toml" <<'TOML'
[store]
kind = "sqlite"
path = "/var/lib/leaderd/leaderd.db"
[[elections]]
name = "wrapped"
TOML
mkdir -p "$W/shared-state"
chown 65532:65532 "$W/shared-state"
# The job: says when it starts and stops; its `sleep 6001` is what
# job_running looks for. Expanded by the app's shell, not here.
# shellcheck disable=SC2016
job='trap "echo app of $LEADERD_IDENTITY stopping; exit 0" TERM
echo "app of $LEADERD_IDENTITY started, fencing token $LEADERD_FENCING_TOKEN"
sleep 6001 & wait'
wrapped() { # NAME PORT: one pod of the chart's wrapper pattern
    local name=$1 port=$2 helper=$W/$1/helper bin=$W/$1/bin
    # emptyDir volumes: empty, writable by anyone.
    mkdir -p "$helper" "$bin"
    chmod 0777 "$helper" "$bin"
    # The two init containers: a static busybox into a scratch volume, then,
    # in the leaderd image, that busybox copies the binary out.
    pod run --rm "${RUN[@]}" --user 65532:65532 -v "$helper:/helper" \
        "$APP" cp /bin/busybox /helper/busybox >"$W/run.log" 2>&1 ||
        fail "$name: the copy helper failed" "$(cat "$W/run.log")"
    pod run --rm "${RUN[@]}" --user 65532:65532 -v "$helper:/helper:ro" -v "$bin:/leaderd" \
        --entrypoint '["/helper/busybox", "cp", "/usr/local/bin/leaderd", "/leaderd/leaderd"]' \
        "$IMAGE" >"$W/run.log" 2>&1 ||
        fail "$name: the init container in $IMAGE failed" "$(cat "$W/run.log")"
    [[ -x $bin/leaderd ]] || fail "$name: the init containers did not copy the binary" "$(ls -la "$bin")"
    # The app container: its command becomes leaderd run -- <app command>.
    pod run -d --name "$name" --hostname "$name" "${RUN[@]}" --user 65532:65532 \
        -e LEADERD_IDENTITY="$name" \
        -v "$bin:/leaderd:ro" -v "$W/leaderd.toml:/etc/leaderd/leaderd.toml:ro" \
        -v "$W/shared-state:/var/lib/leaderd" \
        "$APP" /leaderd/leaderd run --config /etc/leaderd/leaderd.toml \
        --listen "127.0.0.1:$port" -- /bin/sh -c "$job" >"$W/run.log" 2>&1 ||
        fail "podman run $APP ($name) failed" "$(cat "$W/run.log")"
}
wrapped leaderd-w1 "$pa"
wait_code "http://127.0.0.1:$pa/leader" 200 20 leaderd-w1
wrapped leaderd-w2 "$pb"
wait_code "http://127.0.0.1:$pb/leader" 503 20 leaderd-w2
for _ in $(seq 100); do job_running leaderd-w1 && break; sleep 0.05; done
job_running leaderd-w1 || fail "the leading app container runs no app" "$(seen leaderd-w1)"
! job_running leaderd-w2 || fail "the follower's app container runs the app too" "$(seen leaderd-w2)"
note "the app runs in leaderd-w1 (leader) only"
pod stop --time 10 leaderd-w1 >/dev/null
wait_code "http://127.0.0.1:$pb/leader" 200 5 leaderd-w2
for _ in $(seq 100); do job_running leaderd-w2 && break; sleep 0.05; done
job_running leaderd-w2 || fail "the new leader's app container runs no app" "$(seen leaderd-w2)"
pod logs leaderd-w1 >"$W/logs" 2>&1
grep -q 'app of leaderd-w1 stopping' "$W/logs" || fail "leaderd-w1's app was not stopped with SIGTERM" "$(cat "$W/logs")"
code=$(pod inspect -f '{{.State.ExitCode}}' leaderd-w1)
[[ $code == 0 ]] || fail "leaderd-w1 exited $code, not 0 (its app exits 0 on SIGTERM)" "$(seen leaderd-w1)"
pod logs leaderd-w2 >"$W/logs" 2>&1
grep -q 'app of leaderd-w2 started, fencing token [0-9]' "$W/logs" || fail "leaderd-w2's app did not start" "$(cat "$W/logs")"
note "after podman stop leaderd-w1 (exit 0, app stopped), the app runs in leaderd-w2"

log "the image holds the binary, the CA certificates and the state directory only"
want='drwxr-xr-x 0:0 ./etc
drwxr-xr-x 0:0 ./etc/ssl
drwxr-xr-x 0:0 ./etc/ssl/certs
-rw-r--r-- 0:0 ./etc/ssl/certs/ca-certificates.crt
drwxr-xr-x 0:0 ./usr
drwxr-xr-x 0:0 ./usr/local
drwxr-xr-x 0:0 ./usr/local/bin
-rwxr-xr-x 0:0 ./usr/local/bin/leaderd
drwxr-xr-x 0:0 ./var
drwxr-xr-x 0:0 ./var/lib
drwxr-x--- 65532:65532 ./var/lib/leaderd'
[[ $files == "$want" ]] ||
    fail "the final stage must hold exactly these files, owners and modes" \
        "$(diff <(printf '%s\n' "$want") <(printf '%s\n' "$files"))"
((certs > 0)) || fail "ca-certificates.crt holds no certificate"
[[ $config == 'user=65532:65532 entrypoint=[leaderd] workdir=/var/lib/leaderd' ]] ||
    fail "image configuration" "$config"
note "file list, owners, modes and configuration as expected"

log "image test passed"
