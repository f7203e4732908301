//! Never two leaders: three real leaderd instances on DynamoDB Local (the
//! `postgres_` scenarios: on PostgreSQL), each behind its own fault proxy and each running `job.py`,
//! which records its life in one shared history. Every scenario injects one
//! fault at a random moment (timings drawn from a seed: printed, and replayed
//! with `LEADERD_SAFETY_SEED=N`), lets the cluster recover, stops everything
//! and runs the checker: no two tenures active at once, fencing tokens only
//! increasing. The failover figures are printed.
//!
//! L = 2 s, R = 1 s, P = 250 ms, G = 500 ms: validity 1.78 s after the last
//! successful renew was sent, a follower waits 2.02 s on an unchanged record.
//!
//! Run one at a time (nextest: test group `cluster`; under `cargo test` the
//! scenarios and the soak serialise themselves).

use crate::cluster;
use crate::common;

use std::thread::sleep;
use std::time::Duration;

use cluster::{
    ClockShift, Cluster, ClusterSpec, ClusterStore, L, R, RECOVERY, SLACK, VALIDITY, between,
    last_line_of_tenure, monotonic_ns, ms,
};
use common::history::Summary;
use common::proxy::Fault;
use nix::sys::signal::Signal;
use rand::RngExt;
use rand::rngs::StdRng;

fn begin(spec: ClusterSpec) -> (Cluster, StdRng) {
    let seed = cluster::seed("LEADERD_SAFETY_SEED", &spec.name);
    let rng = cluster::scenario_rng(seed, &spec.name);
    (Cluster::start(spec), rng)
}

/// A leader whose child runs, after a random 1–2 s (a random phase against
/// its renewals): (index, fencing token).
fn settled_leader(c: &Cluster, rng: &mut StdRng) -> (usize, u64) {
    c.wait_leader(Duration::from_secs(30), &[]);
    sleep(between(
        rng,
        Duration::from_millis(1_000),
        Duration::from_millis(2_000),
    ));
    let i = c.wait_leader(Duration::from_secs(5), &[]);
    match c.token_of(i) {
        Some(token) => (i, token),
        None => c.fail(&format!(
            "{} stopped leading with no fault injected",
            c.nodes[i].identity
        )),
    }
}

/// After the fault: a leader again (not one of `skip`), whose child then runs
/// for a random 1–2 s.
fn recover(c: &Cluster, rng: &mut StdRng, skip: &[usize]) -> usize {
    let i = c.wait_leader(RECOVERY, skip);
    sleep(between(
        rng,
        Duration::from_millis(1_000),
        Duration::from_millis(2_000),
    ));
    i
}

/// Stop everything, check the history (zero overlap), print the figures.
fn end(c: &mut Cluster) -> Summary {
    let log = c.finish();
    let summary = c.check(&log);
    c.report(&summary);
    summary
}

/// The old tenure (identity, token) wrote nothing after `bound_ns`.
fn assert_tenure_ended_by(
    c: &Cluster,
    log: &str,
    who: usize,
    token: u64,
    from_ns: u64,
    allowed: Duration,
    what: &str,
) {
    let identity = &c.nodes[who].identity;
    let Some(last) = last_line_of_tenure(log, identity, token) else {
        c.fail(&format!("no history line of {identity} token {token}"));
    };
    let ran = Duration::from_nanos(last.saturating_sub(from_ns));
    eprintln!(
        "[{}] old child ({identity}, token {token}) last seen {} after {what}",
        c.name,
        ms(ran)
    );
    if ran > allowed {
        c.fail(&format!(
            "the old child ({identity}, token {token}) ran {} after {what}, allowed {}",
            ms(ran),
            ms(allowed)
        ));
    }
}

fn assert_failover(c: &Cluster, summary: &Summary, old: usize, old_token: u64) {
    let moved = summary
        .tenures
        .iter()
        .any(|t| t.id.fencing_token > old_token && t.id.identity != c.nodes[old].identity);
    if !moved {
        c.fail(&format!(
            "expected another instance to lead after the fault on {}:\n{summary}",
            c.nodes[old].identity
        ));
    }
}

#[test]
fn kill_9_of_the_leader() {
    let (mut c, mut rng) = begin(ClusterSpec::new("kill9"));
    let (old, token) = settled_leader(&c, &mut rng);
    let f = c.fault_begins(Some(old), "kill -9 of leaderd");
    let killed_at = monotonic_ns();
    c.nodes[old].kill9();
    c.fault_ends(f);
    recover(&c, &mut rng, &[old]);
    let log = c.history_text();
    // The guard takes the child down with leaderd.
    assert_tenure_ended_by(
        &c,
        &log,
        old,
        token,
        killed_at,
        Duration::from_secs(1) + SLACK,
        "kill -9 of its leaderd",
    );
    let summary = end(&mut c);
    assert_failover(&c, &summary, old, token);
}

#[test]
fn sigstop_of_leaderd_alone_for_1_5_l() {
    let (mut c, mut rng) = begin(ClusterSpec::new("sigstop-alone"));
    let (old, token) = settled_leader(&c, &mut rng);
    let f = c.fault_begins(Some(old), "SIGSTOP of leaderd alone for 1.5 L");
    let stopped_at = monotonic_ns();
    c.nodes[old].paused = true;
    c.nodes[old].signal(Signal::SIGSTOP);
    sleep(L.mul_f64(1.5));
    c.nodes[old].signal(Signal::SIGCONT);
    c.nodes[old].paused = false;
    c.fault_ends(f);
    // Its child was killed at the end of validity by the guard, which is not
    // stopped with leaderd.
    let log = c.history_text();
    assert_tenure_ended_by(
        &c,
        &log,
        old,
        token,
        stopped_at,
        VALIDITY + SLACK,
        "SIGSTOP of its leaderd",
    );
    // Thawed, it must not claim the old tenure.
    if c.token_of(old) == Some(token) {
        c.fail("the thawed leaderd answers 200 with its old fencing token");
    }
    recover(&c, &mut rng, &[]);
    let summary = end(&mut c);
    assert_failover(&c, &summary, old, token);
}

#[test]
fn sigstop_of_leaderd_and_its_child_a_frozen_machine() {
    let (mut c, mut rng) = begin(ClusterSpec::new("frozen-machine"));
    let (old, token) = settled_leader(&c, &mut rng);
    let f = c.fault_begins(
        Some(old),
        "SIGSTOP of leaderd, guard and child group for 1.5 L",
    );
    let frozen = c.freeze(old);
    sleep(L.mul_f64(1.5));
    c.thaw(old, &frozen);
    let thawed_at = monotonic_ns();
    c.fault_ends(f);
    recover(&c, &mut rng, &[]);
    let log = c.finish();
    let summary = c.check_measuring_overlap(&log);
    c.report(&summary);
    // After a whole-machine freeze the old child may run for a
    // moment after it thaws (fencing tokens cover that). Measured, reported,
    // bounded.
    let seen = summary.max_seen_running();
    let after_thaw = last_line_of_tenure(&log, &c.nodes[old].identity, token)
        .map(|t| Duration::from_nanos(t.saturating_sub(thawed_at)))
        .unwrap_or_default();
    eprintln!(
        "[{}] frozen machine: {} overlap(s); old child seen running {} inside the new tenure, \
         its last line {} after the thaw",
        c.name,
        summary.overlaps.len(),
        ms(seen),
        ms(after_thaw)
    );
    if seen >= Duration::from_secs(1) || after_thaw >= Duration::from_secs(1) {
        c.fail(&format!(
            "the old child ran too long after the thaw: seen {} inside the new tenure, last line {} after the thaw",
            ms(seen),
            ms(after_thaw)
        ));
    }
    assert_failover(&c, &summary, old, token);
}

#[test]
fn blackhole_of_the_leaders_store_traffic() {
    let (mut c, mut rng) = begin(ClusterSpec::new("blackhole"));
    let (old, token) = settled_leader(&c, &mut rng);
    let hold = between(
        &mut rng,
        Duration::from_millis(2_500),
        Duration::from_millis(5_000),
    );
    let f = c.fault_begins(Some(old), format!("blackhole for {}", ms(hold)));
    let cut = monotonic_ns();
    c.set_fault(Some(old), Fault::Blackhole);
    sleep(hold);
    c.set_fault(Some(old), Fault::None);
    c.fault_ends(f);
    let log = c.history_text();
    assert_tenure_ended_by(&c, &log, old, token, cut, VALIDITY + SLACK, "the cut");
    recover(&c, &mut rng, &[]);
    let summary = end(&mut c);
    assert_failover(&c, &summary, old, token);
}

// ------------------------------------------------------------ PostgreSQL

fn postgres(name: &str, own_server: bool) -> ClusterSpec {
    let mut spec = ClusterSpec::new(name);
    spec.store = ClusterStore::Postgres;
    spec.own_emulator = own_server;
    spec
}

/// The leader's connections to PostgreSQL go silent (TLS inside the
/// proxy's TCP): its renewals time out, its child stops by the end of its
/// validity, and another instance takes over.
#[test]
fn postgres_blackhole_of_the_leaders_store_traffic() {
    let (mut c, mut rng) = begin(postgres("pg-blackhole", false));
    let (old, token) = settled_leader(&c, &mut rng);
    let hold = between(
        &mut rng,
        Duration::from_millis(2_500),
        Duration::from_millis(5_000),
    );
    let f = c.fault_begins(Some(old), format!("blackhole for {}", ms(hold)));
    let cut = monotonic_ns();
    c.set_fault(Some(old), Fault::Blackhole);
    sleep(hold);
    c.set_fault(Some(old), Fault::None);
    c.fault_ends(f);
    let log = c.history_text();
    assert_tenure_ended_by(&c, &log, old, token, cut, VALIDITY + SLACK, "the cut");
    recover(&c, &mut rng, &[]);
    let summary = end(&mut c);
    assert_failover(&c, &summary, old, token);
}

/// A third of every instance's chunks and new connections swallowed for
/// a while (each swallowed one silences its connection): requests time
/// out and connections are opened again, at random, on every instance.
#[test]
fn postgres_drops_on_every_instance() {
    let (mut c, mut rng) = begin(postgres("pg-drops", false));
    let _ = settled_leader(&c, &mut rng);
    let hold = between(
        &mut rng,
        Duration::from_millis(4_000),
        Duration::from_millis(8_000),
    );
    for proxy in &c.proxies {
        proxy.seed(rng.random());
    }
    let f = c.fault_begins(None, format!("a third dropped for {}", ms(hold)));
    c.set_fault(None, Fault::DropFraction(0.33));
    sleep(hold);
    c.set_fault(None, Fault::None);
    c.fault_ends(f);
    recover(&c, &mut rng, &[]);
    end(&mut c);
}

/// The whole server SIGSTOPped for 2·L: no renewal answers, every child
/// stops by the end of its validity; once it runs again, one leader.
#[test]
fn postgres_server_sigstopped_for_2_l() {
    let (mut c, mut rng) = begin(postgres("pg-sigstop", true));
    let (old, token) = settled_leader(&c, &mut rng);
    let f = c.fault_begins(None, format!("server SIGSTOPped for {}", ms(L * 2)));
    let cut = monotonic_ns();
    c.pause_postgres(true);
    sleep(L * 2);
    c.pause_postgres(false);
    c.fault_ends(f);
    let log = c.history_text();
    assert_tenure_ended_by(&c, &log, old, token, cut, VALIDITY + SLACK, "the stop");
    recover(&c, &mut rng, &[]);
    end(&mut c);
}

/// The server killed with -9 (every process) and started again on the
/// same data: the leases it acknowledged survive, so no one leads early.
#[test]
fn postgres_server_killed_and_restarted() {
    let (mut c, mut rng) = begin(postgres("pg-kill9", true));
    let _ = settled_leader(&c, &mut rng);
    let f = c.fault_begins(None, "server kill -9 and restart");
    let down = c.restart_postgres();
    c.fault_ends(f);
    eprintln!("[{}] server gone for {}", c.name, ms(down));
    recover(&c, &mut rng, &[]);
    end(&mut c);
}

#[test]
fn latency_of_0_8_l_on_the_leaders_requests() {
    let (mut c, mut rng) = begin(ClusterSpec::new("latency"));
    let (old, token) = settled_leader(&c, &mut rng);
    let hold = between(
        &mut rng,
        Duration::from_millis(3_000),
        Duration::from_millis(6_000),
    );
    let f = c.fault_begins(Some(old), format!("latency 0.8 L for {}", ms(hold)));
    let from = monotonic_ns();
    c.set_fault(Some(old), Fault::Latency(L.mul_f64(0.8)));
    sleep(hold);
    c.set_fault(Some(old), Fault::None);
    c.fault_ends(f);
    // Every renew now arrives after its budget (R): none succeeds, so the
    // tenure ends at validity at the latest.
    let log = c.history_text();
    assert_tenure_ended_by(
        &c,
        &log,
        old,
        token,
        from,
        VALIDITY + SLACK,
        "the latency began",
    );
    recover(&c, &mut rng, &[]);
    end(&mut c);
}

#[test]
fn throttling_storm_on_every_instance() {
    let (mut c, mut rng) = begin(ClusterSpec::new("throttling"));
    let (_old, _token) = settled_leader(&c, &mut rng);
    let hold = between(
        &mut rng,
        Duration::from_millis(1_000),
        Duration::from_millis(5_000),
    );
    let f = c.fault_begins(
        None,
        format!("throttling of every request for {}", ms(hold)),
    );
    c.proxies.iter().for_each(|p| p.clear_counts());
    c.set_fault(None, Fault::Throttle);
    sleep(hold);
    let throttled: u64 = c
        .proxies
        .iter()
        .map(|p| p.counts().values().sum::<u64>())
        .sum();
    c.set_fault(None, Fault::None);
    c.fault_ends(f);
    if throttled == 0 {
        c.fail("no request reached the store during the storm: nothing was throttled");
    }
    // leaderd saw the answers as throttling, not as some other error.
    let counted: f64 = c
        .nodes
        .iter()
        .filter_map(|n| common::daemon::http(n.port, "GET", "/metrics", &[]))
        .map(|(_, text)| {
            text.lines()
                .filter(|l| l.starts_with("leaderd_store_errors_total{"))
                .filter(|l| l.contains("class=\"throttled\""))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum();
    if counted < 1.0 {
        c.fail(&format!(
            "{throttled} requests were throttled, but no instance counted a throttled store error"
        ));
    }
    recover(&c, &mut rng, &[]);
    let summary = end(&mut c);
    eprintln!(
        "[{}] {} tenure(s) across a {} storm; {throttled} requests throttled, {counted} counted as throttled",
        c.name,
        summary.tenures.len(),
        ms(hold)
    );
}

#[test]
fn renew_applied_but_its_answer_lost() {
    let (mut c, mut rng) = begin(ClusterSpec::new("lost-answer"));
    let (old, _token) = settled_leader(&c, &mut rng);
    let hold = between(
        &mut rng,
        Duration::from_millis(3_000),
        Duration::from_millis(6_000),
    );
    let f = c.fault_begins(
        Some(old),
        format!("PutItem applied, answer lost, for {}", ms(hold)),
    );
    c.proxies[old].clear_counts();
    c.proxies[old].set_for(&["PutItem"], Fault::ApplyThenLoseAnswer);
    sleep(hold);
    let hit = c.proxies[old].counts().get("PutItem").copied().unwrap_or(0);
    c.set_fault(Some(old), Fault::None);
    c.fault_ends(f);
    if hit == 0 {
        c.fail(
            "the leader sent no PutItem while its answers were lost: the fault was never exercised",
        );
    }
    recover(&c, &mut rng, &[]);
    let summary = end(&mut c);
    eprintln!(
        "[{}] {hit} PutItem answer(s) lost; {} tenure(s)",
        c.name,
        summary.tenures.len()
    );
}

#[test]
fn wall_clock_shifted_by_an_hour_on_leader_and_followers() {
    let mut spec = ClusterSpec::new("clock-shift");
    let seed = cluster::seed("LEADERD_SAFETY_SEED", &spec.name);
    let mut rng = cluster::scenario_rng(seed, &spec.name);
    // Every instance shifted, both directions present: whoever leads, its
    // followers run on other clocks.
    let mut shifts = [
        ClockShift::Behind1h,
        ClockShift::Ahead1h,
        ClockShift::Behind1h,
    ];
    if rng.random_bool(0.5) {
        shifts[2] = ClockShift::Ahead1h;
    }
    let first = rng.random_range(0..3);
    shifts.rotate_left(first);
    spec.shifts = shifts;
    eprintln!("[{}] wall-clock shifts: {shifts:?}", spec.name);
    let mut c = Cluster::start(spec);

    // A crash hands the lease over across clocks.
    let (old, token) = settled_leader(&c, &mut rng);
    let f = c.fault_begins(
        Some(old),
        format!("kill -9 (clock {:?})", c.nodes[old].shift),
    );
    c.nodes[old].kill9();
    c.fault_ends(f);
    recover(&c, &mut rng, &[old]);
    let opposite = match c.nodes[old].shift {
        ClockShift::Ahead1h => ClockShift::Behind1h,
        _ => ClockShift::Ahead1h,
    };
    c.restart_node(old, opposite);

    // The guard runs on the shifted clock too: it must neither spin nor miss
    // its deadline. Stop leaderd alone on leaders of both shifts (the next
    // leader is another instance each time; at most four rounds).
    let mut stopped_shifts = Vec::new();
    for _ in 0..4 {
        let leader = c.wait_leader(RECOVERY, &[]);
        let shift = c.nodes[leader].shift;
        let guard_cpu = c.guard_cpu(leader, Duration::from_secs(2));
        eprintln!(
            "[{}] guard of {} (clock {shift:?}) used {} CPU in 2 s",
            c.name,
            c.nodes[leader].identity,
            ms(guard_cpu)
        );
        if guard_cpu > Duration::from_millis(500) {
            c.fail(&format!(
                "the guard of {} (clock {shift:?}) used {} of CPU in 2 s: its deadline timer fires in a loop",
                c.nodes[leader].identity,
                ms(guard_cpu)
            ));
        }
        let Some(leader_token) = c.token_of(leader) else {
            continue;
        };
        let f = c.fault_begins(
            Some(leader),
            format!("SIGSTOP of leaderd alone for 1.5 L (clock {shift:?})"),
        );
        let stopped_at = monotonic_ns();
        c.nodes[leader].paused = true;
        c.nodes[leader].signal(Signal::SIGSTOP);
        sleep(L.mul_f64(1.5));
        c.nodes[leader].signal(Signal::SIGCONT);
        c.nodes[leader].paused = false;
        c.fault_ends(f);
        let log = c.history_text();
        assert_tenure_ended_by(
            &c,
            &log,
            leader,
            leader_token,
            stopped_at,
            VALIDITY + SLACK,
            "SIGSTOP of its leaderd",
        );
        stopped_shifts.push(shift);
        if stopped_shifts.contains(&ClockShift::Ahead1h)
            && stopped_shifts.contains(&ClockShift::Behind1h)
        {
            break;
        }
    }

    // A blackholed leader on a shifted clock.
    let third = recover(&c, &mut rng, &[]);
    let third_token = c
        .token_of(third)
        .unwrap_or_else(|| c.fail("the leader lost its lease with no fault"));
    let hold = between(
        &mut rng,
        Duration::from_millis(2_500),
        Duration::from_millis(4_000),
    );
    let f = c.fault_begins(
        Some(third),
        format!(
            "blackhole for {} (clock {:?})",
            ms(hold),
            c.nodes[third].shift
        ),
    );
    let cut = monotonic_ns();
    c.set_fault(Some(third), Fault::Blackhole);
    sleep(hold);
    c.set_fault(Some(third), Fault::None);
    c.fault_ends(f);
    let log = c.history_text();
    assert_tenure_ended_by(
        &c,
        &log,
        third,
        third_token,
        cut,
        VALIDITY + SLACK,
        "the cut",
    );
    recover(&c, &mut rng, &[]);
    let summary = end(&mut c);
    assert_failover(&c, &summary, old, token);
    assert_failover(&c, &summary, third, third_token);
    eprintln!(
        "[{}] leaderd stopped alone on leaders with clocks {stopped_shifts:?}",
        c.name
    );
}

/// Emulator restarted (all data lost, table created again by the test, as
/// an operator would). The store is gone for longer than a lease while the
/// JVM starts, so the old leader's validity runs out before anyone can
/// create the item again.
fn emulator_restart(strict: bool) {
    let mut spec = ClusterSpec::new(if strict {
        "restart-strict"
    } else {
        "restart-default"
    });
    spec.own_emulator = true;
    spec.strict_new_lease = strict;
    let (mut c, mut rng) = begin(spec);
    let (_old, _token) = settled_leader(&c, &mut rng);
    let f = c.fault_begins(None, "emulator restart (data lost)");
    let down = c.restart_emulator();
    c.fault_ends(f);
    eprintln!(
        "[{}] store gone for {} (restart and table creation)",
        c.name,
        ms(down)
    );
    recover(&c, &mut rng, &[]);
    let log = c.finish();
    if strict {
        let summary = c.check(&log);
        c.report(&summary);
    } else {
        // Without strict_new_lease, deleting a live item voids the
        // guarantee for up to R. That much is allowed, and reported.
        let summary = c.check_measuring_overlap(&log);
        c.report(&summary);
        eprintln!(
            "[{}] without strict_new_lease: {} overlap(s), max {} (allowed: R = {})",
            c.name,
            summary.overlaps.len(),
            ms(summary.max_overlap()),
            ms(R)
        );
        if summary.max_overlap() > R + SLACK {
            c.fail(&format!(
                "overlap {} beyond R + slack",
                ms(summary.max_overlap())
            ));
        }
    }
}

#[test]
fn emulator_restart_with_strict_new_lease() {
    emulator_restart(true);
}

#[test]
fn emulator_restart_without_strict_new_lease() {
    emulator_restart(false);
}

/// The live lease item deleted while the store stays up: the fast form of
/// data loss, where `strict_new_lease` makes the difference.
fn live_item_deleted(strict: bool, sessions: bool) {
    let mut spec = ClusterSpec::new(match (strict, sessions) {
        (true, _) => "deleted-strict",
        (false, true) => "deleted-default",
        (false, false) => "deleted-self-leased",
    });
    spec.strict_new_lease = strict;
    spec.sessions = Some(sessions);
    let (mut c, mut rng) = begin(spec);
    let (old, token) = settled_leader(&c, &mut rng);
    let f = c.fault_begins(None, "DeleteItem of the live lease item");
    c.delete_lease_item();
    c.fault_ends(f);
    // Someone creates the item again, and leads at once (default) or after
    // L·(1+D) (strict).
    let ok = common::daemon::wait_until(RECOVERY, || {
        c.leaders()
            .iter()
            .any(|&i| c.token_of(i).is_some_and(|t| t != token))
    });
    if ok.is_none() {
        c.fail("no new tenure after the item was deleted");
    }
    recover(&c, &mut rng, &[]);
    let log = c.finish();
    if strict {
        let summary = c.check(&log);
        c.report(&summary);
    } else {
        let summary = c.check_measuring_overlap(&log);
        c.report(&summary);
        // Held through its session (the default), the holder never
        // rewrites the record: it reads it back, one batch every 2R. Its
        // own lease, it notices at its next renew.
        let bound = if sessions { 2 * R } else { R };
        eprintln!(
            "[{}] without strict_new_lease: {} overlap(s), max {} (the documented bound is {}); old leader was {}",
            c.name,
            summary.overlaps.len(),
            ms(summary.max_overlap()),
            ms(bound),
            c.nodes[old].identity
        );
        if summary.max_overlap() > bound + SLACK {
            c.fail(&format!(
                "overlap {} beyond the bound + slack",
                ms(summary.max_overlap())
            ));
        }
    }
}

#[test]
fn live_item_deleted_with_strict_new_lease() {
    live_item_deleted(true, true);
}

#[test]
fn live_item_deleted_without_sessions() {
    live_item_deleted(false, false);
}

#[test]
fn live_item_deleted_without_strict_new_lease() {
    live_item_deleted(false, true);
}

#[test]
fn stalled_async_runtime_in_the_leader() {
    let (mut c, mut rng) = begin(ClusterSpec::new("stall"));
    let (old, token) = settled_leader(&c, &mut rng);
    let stall = between(
        &mut rng,
        Duration::from_millis(2_500),
        Duration::from_millis(4_000),
    );
    let f = c.fault_begins(
        Some(old),
        format!("async runtime stalled for {}", ms(stall)),
    );
    let asked = monotonic_ns();
    c.nodes[old].paused = true;
    c.nodes[old].stall(stall);
    // The hook polls every 50 ms; then nothing in leaderd's runtime runs.
    sleep(stall + Duration::from_millis(100));
    c.nodes[old].paused = false;
    c.fault_ends(f);
    let log = c.history_text();
    // The guard owns the deadline: the child dies at validity although
    // leaderd cannot act.
    assert_tenure_ended_by(
        &c,
        &log,
        old,
        token,
        asked,
        VALIDITY + Duration::from_millis(50) + SLACK,
        "the stall request",
    );
    if !c.nodes[old].log().contains("stalling the async runtime") {
        c.fail("the stall hook did not fire (no `stalling the async runtime` in the log)");
    }
    recover(&c, &mut rng, &[]);
    let summary = end(&mut c);
    assert_failover(&c, &summary, old, token);
}
