//! The store's items. SQLite: the file (or, when it does not exist yet, a
//! scratch file beside it, since `run` creates it) opened for writing on a
//! filesystem that takes SQLite's locks, its table, and the calls on a
//! scratch record. DynamoDB: the region and where it came from, the table
//! (reachable, ACTIVE, the key leaderd needs, TTL where sessions use it),
//! CreateTable where `store.create_table` asks for it, the calls on a
//! scratch record, and the clock against the `Date` of the answers.
//! PostgreSQL: the server (a writable primary) and the table (its columns,
//! key and the role's privileges), the table's creation where
//! `store.create_table` asks for it, the calls on a scratch record, and
//! the clock against the server's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{StoreConfig, StoreKind};
use crate::lease::dynamodb::region::{self, RegionSource};
use crate::lease::dynamodb::{DatedAnswer, DynamoConfig, DynamoStore, TtlStatus};
use crate::lease::postgres::PostgresStore;
use crate::lease::sqlite::SqliteStore;
use crate::lease::{LeaseStore, StoreError, new_rvn};
use crate::text::duration;

use super::config::Plan;
use super::report::{Item, Report, fail, ok, store_failure, warn};
use super::scratch;

/// The time the table's checks may take, each.
const BUDGET: Duration = Duration::from_secs(10);

/// How far this host's clock may be from the store's before it is worth a
/// warning.
const CLOCK_TOLERANCE_MS: i64 = 1_000;

/// Check the store `plan` names.
pub async fn check(plan: &Plan, store: &StoreConfig, report: &mut Report) {
    match store.kind {
        StoreKind::Sqlite => sqlite(plan, &store.path, report).await,
        StoreKind::Dynamodb => dynamodb(plan, store, report).await,
        StoreKind::Postgres => postgres(plan, store, report).await,
    }
}

// ---------------------------------------------------------------------------
// SQLite.

async fn sqlite(plan: &Plan, path: &Path, report: &mut Report) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    if path.exists() {
        match SqliteStore::open(path) {
            Ok(store) => {
                report.add(filesystem(&dir));
                match store.check(BUDGET).await {
                    Ok(()) => {
                        report.add(ok(
                            "store",
                            format!(
                                "SQLite file {}: opened for writing, its table as leaderd needs it",
                                path.display()
                            ),
                        ));
                        scratch::try_calls(&store, &plan.identity, plan.features, report).await;
                    }
                    // A table leaderd cannot use: nothing to try on it.
                    Err(e @ StoreError::WrongSchema { .. }) => report.add(
                        store_failure("store", &e).fix(
                            "set store.path (--store-path) to another file, or move this one away so that `run` creates a new one",
                        ),
                    ),
                    Err(e) => report.add(store_failure("store", &e)),
                }
            }
            Err(e) => report.add(cannot_open(path, &dir, &e)),
        }
        report.add(clock_not_compared());
        return;
    }
    if !dir.is_dir() {
        report.add(
            fail(
                "store",
                format!(
                    "SQLite file {}: its directory {} does not exist, and `run` creates only the file",
                    path.display(),
                    dir.display()
                ),
            )
            .fix("create the directory, or set store.path (--store-path) to a file in one that exists"),
        );
        report.add(clock_not_compared());
        return;
    }
    // `run` creates the file: try that with a scratch file beside it, so
    // that the check leaves no store behind.
    let stand_in = dir.join(format!(".leaderd-check-{}.db", &new_rvn()[..12]));
    match SqliteStore::open(&stand_in) {
        Ok(store) => {
            report.add(ok(
                "store",
                format!(
                    "SQLite file {} does not exist yet, and `run` creates it: a scratch file created beside it stands in for it (removed after)",
                    path.display()
                ),
            ));
            report.add(filesystem(&dir));
            scratch::try_calls(&store, &plan.identity, plan.features, report).await;
            // Closes its connections before its files are removed.
            drop(store);
        }
        Err(e) => report.add(cannot_open(path, &dir, &e)),
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = stand_in.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
    report.add(clock_not_compared());
}

/// A SQLite file that cannot be opened or created, and who could fix it.
fn cannot_open(path: &Path, dir: &Path, e: &StoreError) -> Item {
    use nix::unistd::{AccessFlags, access};
    let writable = |p: &Path| access(p, AccessFlags::W_OK).is_ok();
    let who = "the user leaderd runs as";
    let fix = if !writable(dir) {
        format!(
            "make {} writable for {who} (SQLite writes its journal beside the file), or set store.path (--store-path) to a writable place",
            dir.display()
        )
    } else if path.exists() && !writable(path) {
        format!(
            "make {} writable for {who}, or set store.path (--store-path) elsewhere",
            path.display()
        )
    } else {
        "correct what the message names".to_owned()
    };
    fail("store", e.to_string()).fix(fix)
}

/// The filesystem `dir` is on: SQLite's locks, and the shared memory of its
/// write-ahead log, hold only among the processes of one host, and on a
/// network filesystem not even there for sure.
fn filesystem(dir: &Path) -> Item {
    let Ok(fs) = nix::sys::statfs::statfs(dir) else {
        return ok("filesystem", "not known: the store's own writes worked");
    };
    // f_type values of network and cluster filesystems (statfs(2)); the
    // last four are not among nix's names.
    let network: &[(i64, &str)] = &[
        (0x6969, "NFS"),
        (0x517B, "SMB"),
        (0x5346_414F, "AFS"),
        (0x7375_7245, "Coda"),
        (0x564C, "NCP"),
        (0xFF53_4D42, "CIFS"),
        (0xFE53_4D42, "SMB2"),
        (0x0102_1997, "9p"),
        (0x00C3_6400, "CephFS"),
    ];
    #[allow(clippy::useless_conversion)] // The type of f_type differs by platform.
    let magic = i64::from(fs.filesystem_type().0);
    match network.iter().find(|(m, _)| *m == magic) {
        Some((_, name)) => warn(
            "filesystem",
            format!(
                "{} is on {name}, a network filesystem: SQLite's locks may not hold there, and they never hold between hosts",
                dir.display()
            ),
        )
        .fix("keep the SQLite file on a local disk; for several hosts use store.kind = \"dynamodb\""),
        None => ok(
            "filesystem",
            format!(
                "{} is on a local filesystem, where SQLite's locks hold among this host's processes",
                dir.display()
            ),
        ),
    }
}

fn clock_not_compared() -> Item {
    ok(
        "clock",
        "not compared: the SQLite store lives on this host, and its records' times are this host's",
    )
}

// ---------------------------------------------------------------------------
// DynamoDB.

async fn dynamodb(plan: &Plan, store: &StoreConfig, report: &mut Report) {
    let (region, source) = match region::resolve(store.region.as_deref()).await {
        Ok(found) => found,
        Err(e) => {
            report.add(
                fail("region", e.to_string())
                    .fix("set --region (store.region) or AWS_REGION to the table's region"),
            );
            return;
        }
    };
    report.add(
        ok(
            "region",
            format!("{region}, from {}", source_words(&source)),
        )
        .with("region", region.clone()),
    );
    let config = DynamoConfig {
        table: store.table.clone(),
        region,
        endpoint_url: store.endpoint_url.clone(),
    };
    let endpoint = config
        .endpoint_url
        .clone()
        .unwrap_or_else(|| "the region's AWS endpoint".to_owned());
    let (dynamo, server_clock) = DynamoStore::with_server_clock(&config).await;
    let usable = table(&dynamo, store, &endpoint, report).await;
    if usable {
        if store.create_table {
            // What `run` does at each start with store.create_table: a
            // CreateTable of the existing table (refused as in use), a
            // DescribeTable and a DescribeTimeToLive.
            match dynamo.create_table(false, BUDGET).await {
                Ok(_) => report.add(ok(
                    "dynamodb:CreateTable",
                    "allowed (store.create_table = true): the table exists, so `run` only finds it in use",
                )),
                Err(e) => report.add(store_failure("dynamodb:CreateTable", &e)),
            }
        }
        if plan.features.sessions {
            report.add(ttl(&dynamo).await);
        }
        scratch::try_calls(&dynamo, &plan.identity, plan.features, report).await;
    }
    report.add(clock(server_clock.best(), server_clock.undated()));
}

fn source_words(source: &RegionSource) -> String {
    match source {
        RegionSource::Config => "the configuration (--region, store.region)".to_owned(),
        other => other.to_string(),
    }
}

/// The table: reachable with these credentials, ACTIVE, keyed as leaderd
/// needs. Whether the rest can be tried.
async fn table(
    dynamo: &DynamoStore,
    store: &StoreConfig,
    endpoint: &str,
    report: &mut Report,
) -> bool {
    let name = &store.table;
    match dynamo.check(BUDGET).await {
        Ok(()) => {
            report.add(ok(
                "table",
                format!(
                    "`{name}` at {endpoint}: ACTIVE, keyed by `election` (string) as leaderd needs"
                ),
            ));
            true
        }
        Err(StoreError::TableMissing(_)) if store.create_table => {
            report.add(
                warn(
                    "table",
                    format!("`{name}` at {endpoint} does not exist; `run` creates it (store.create_table = true)"),
                )
                .fix("create it now with `leaderd table create` (the create policy) and check again: CreateTable and the calls on records cannot be tried on a table that does not exist"),
            );
            false
        }
        Err(e) => {
            let item = match &e {
                StoreError::Transport(_) | StoreError::Timeout(_) => "store",
                StoreError::Credentials(_) => "credentials",
                _ => "table",
            };
            report.add(store_failure(item, &e));
            false
        }
    }
}

/// DynamoDB's TTL on `expires_at`: with sessions, ended daemons' session
/// records are deleted by it, and by nothing else.
async fn ttl(dynamo: &DynamoStore) -> Item {
    match dynamo.ttl().await {
        Ok(TtlStatus::Enabled) => ok(
            "ttl",
            "on for `expires_at`: DynamoDB deletes the session records of daemons that ended",
        ),
        Ok(TtlStatus::Disabled) => warn(
            "ttl",
            "off: the session record of every daemon that ended stays in the table (nothing takes it for an election, but one piles up per start of `leaderd run`)",
        )
        .fix("turn TTL on for `expires_at`: `leaderd table create --ttl` (the create policy), or in the table's settings"),
        Ok(TtlStatus::Unsupported(why)) => warn(
            "ttl",
            format!("not known: {why}; ended daemons' session records may stay in the table"),
        )
        .fix("on DynamoDB itself, turn TTL on for `expires_at`"),
        Err(e) => {
            let failed = store_failure("ttl", &e);
            warn(
                "ttl",
                format!(
                    "not known: {}; `run` does not need to know, but without TTL ended daemons' session records stay in the table",
                    failed.detail
                ),
            )
            .fix(failed.fix.unwrap_or_default())
        }
    }
}

// ---------------------------------------------------------------------------
// PostgreSQL.

async fn postgres(plan: &Plan, store: &StoreConfig, report: &mut Report) {
    let spec = store
        .postgres
        .as_ref()
        .expect("the configuration sets it whenever store.kind is postgres");
    let pg = match PostgresStore::new(spec) {
        Ok(pg) => pg,
        Err(e) => {
            report.add(store_failure("store", &e));
            return;
        }
    };
    let server = pg.server().to_owned();
    let name = pg.table().to_owned();
    let mut checked = pg.check(BUDGET).await;
    if store.create_table && matches!(checked, Err(StoreError::TableMissing(_))) {
        // What `run` does at start with store.create_table.
        checked = match pg.create_table(BUDGET).await {
            Ok(()) => {
                report.add(ok(
                    "create table",
                    format!("`{name}` did not exist: created (store.create_table = true), as `run` would"),
                ));
                pg.check(BUDGET).await
            }
            Err(e) => Err(e),
        };
    }
    match checked {
        Ok(()) => {
            report.add(ok(
                "table",
                format!(
                    "`{name}` at {server}: a writable primary; the table's columns, key (election) and privileges as leaderd needs"
                ),
            ));
            scratch::try_calls(&pg, &plan.identity, plan.features, report).await;
        }
        Err(e) => {
            let item = match &e {
                StoreError::Transport(_) | StoreError::Timeout(_) => "store",
                StoreError::Credentials(_) => "credentials",
                _ => "table",
            };
            let failed = store_failure(item, &e);
            let fix = match &e {
                StoreError::Transport(_) | StoreError::Timeout(_) => "check store.url's host and port, sslmode and the CA file, and that this host reaches the server (DNS, routes, firewalls, pg_hba.conf)".to_owned(),
                StoreError::Credentials(_) => "give leaderd's role its password: in store.url, store.password_file or PGPASSWORD".to_owned(),
                StoreError::TableMissing(_) => "create it: `leaderd table create --store postgres` (or `--print` for the SQL), or set store.create_table = true".to_owned(),
                StoreError::WrongSchema { .. } => "use another table (store.table), or recreate this one as `leaderd table create --store postgres --print` shows".to_owned(),
                _ => failed.fix.clone().unwrap_or_default(),
            };
            report.add(failed.fix(fix));
        }
    }
    let sent_ms = crate::clock::unix_ms();
    let answer = pg.server_unix_ms(BUDGET).await;
    let received_ms = crate::clock::unix_ms();
    report.add(match answer {
        Ok(server_ms) => {
            let ms = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            skew(
                ms(sent_ms).saturating_sub(server_ms),
                ms(received_ms).saturating_sub(server_ms),
                received_ms.saturating_sub(sent_ms),
                "its clock_timestamp()",
            )
        }
        Err(e) => warn(
            "clock",
            format!("not compared: the server did not answer ({e})"),
        )
        .fix("compare this host's clock with a time server (chronyc tracking, timedatectl)"),
    });
}

/// This host's wall clock against the store's, from the `Date` of the
/// answer with the shortest round trip. A warning when it is surely more
/// than a second off: fencing tokens and `leader_since` are taken from
/// it; who leads never depends on it.
pub fn clock(best: Option<DatedAnswer>, undated: u32) -> Item {
    let Some(answer) = best else {
        let why = if undated > 0 {
            "the store's answers carry no Date header"
        } else {
            "the store did not answer"
        };
        return warn("clock", format!("not compared: {why}"))
            .fix("compare this host's clock with a time server (chronyc tracking, timedatectl)");
    };
    let (least, most) = answer.skew_bounds_ms();
    skew(
        least,
        most,
        answer.received_ms.saturating_sub(answer.sent_ms),
        "its Date header (whole seconds)",
    )
}

/// The clock item for a skew of this host ahead of the store's between
/// `least` and `most` ms (negative: behind), measured by `source` over a
/// round trip of `round_trip_ms`.
fn skew(least: i64, most: i64, round_trip_ms: u64, source: &str) -> Item {
    let signed = |ms: i64| {
        let d = duration(Duration::from_millis(ms.unsigned_abs()));
        match ms {
            0 => d,
            ms if ms > 0 => format!("{d} ahead"),
            _ => format!("{d} behind"),
        }
    };
    let bounds = format!(
        "{source} puts this host between {} and {}",
        signed(least),
        signed(most)
    );
    let item = if least > CLOCK_TOLERANCE_MS {
        warn(
            "clock",
            format!("this host's clock is ahead of the store's: {bounds}"),
        )
    } else if most < -CLOCK_TOLERANCE_MS {
        warn(
            "clock",
            format!("this host's clock is behind the store's: {bounds}"),
        )
    } else {
        ok("clock", format!("within 1s of the store's: {bounds}"))
    };
    let item = item
        .with("skew_min_ms", least)
        .with("skew_max_ms", most)
        .with("round_trip_ms", round_trip_ms);
    if item.status == super::report::Status::Warn {
        item.fix("sync this host's clock (chrony, systemd-timesyncd): fencing tokens and leader_since come from it, though who leads never does")
    } else {
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::check::report::Status;

    fn answer(date_s: i64, sent_ms: u64, received_ms: u64) -> Option<DatedAnswer> {
        Some(DatedAnswer {
            date_s,
            sent_ms,
            received_ms,
        })
    }

    #[test]
    fn a_clock_surely_more_than_a_second_off_is_a_warning() {
        // An hour ahead.
        let item = clock(answer(1_000, 3_601_000_200, 3_601_000_300), 0);
        assert_eq!(item.status, Status::Warn, "{item:?}");
        assert!(item.detail.contains("ahead"), "{}", item.detail);
        assert!(item.fix.is_some());
        // An hour behind.
        let item = clock(answer(10_000, 6_400_000, 6_400_050), 0);
        assert_eq!(item.status, Status::Warn, "{item:?}");
        assert!(item.detail.contains("behind"), "{}", item.detail);
        // Same second: fine, whatever the Date's rounding.
        let item = clock(answer(1_000, 1_000_900, 1_001_100), 0);
        assert_eq!(item.status, Status::Ok, "{item:?}");
        // 1.5 s ahead, but a slow answer: not surely more than 1 s.
        let item = clock(answer(1_000, 1_001_500, 1_004_000), 0);
        assert_eq!(item.status, Status::Ok, "{item:?}");
    }

    #[test]
    fn no_date_is_said() {
        assert!(clock(None, 2).detail.contains("no Date header"));
        assert!(clock(None, 0).detail.contains("did not answer"));
    }
}
