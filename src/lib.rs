//! leaderd: a leader-election daemon.
//!
//! Data flows one way: configuration -> lease stores -> election engines ->
//! (child supervisor, HTTP, metrics, watch) watching the engines' state.
//! Every decision the engines make is the pure core's, which imports none
//! of the other modules.
//!
//! - [`core`]: the pure part: every decision, without IO, clock reads or
//!   randomness of its own.
//! - [`clock`]: the boot-time clock every decision is timed with.
//! - [`lease`]: the store interface and its backends (SQLite's connection
//!   lanes, table and queries each in a file of their own); the record
//!   they store is the core's.
//! - [`election`]: elections as the rest of leaderd sees them: the core's
//!   types, what the driver reports, the channel the watch clients feed.
//! - [`driver`]: the one IO driver of a daemon's node (the core's `node`,
//!   which runs every election's rules and the daemon's session): its
//!   store requests performed concurrently, its hints, time and commands
//!   fed back, its states published, its notes logged and counted.
//! - [`balance`]: many elections shared fairly among the daemons that
//!   campaign for them (member records in the store, handovers).
//! - [`app_check`]: probes the app leaderd stands for; campaigning is gated
//!   on its verdict.
//! - [`config`]: figment layers -> validated, immutable configuration.
//! - [`cli`]: the command line (clap), `check`, `status`, `table`, `lock`
//!   and `resign`.
//! - [`http`]: the HTTP server: serving and its limits, the router, the
//!   read handlers (`/leader`, `/status`, `/healthz`, `/metrics`) and
//!   resign.
//! - [`watch`]: the watch streams a leader's followers hold: their wire
//!   format, the leader's end, the follower's client, and with sessions
//!   one stream per leader daemon.
//! - [`http_client`]: a plain HTTP connection to another leaderd (the
//!   watch client's, and `leaderd resign`'s).
//! - [`metrics`]: Prometheus metrics, registered once (every name and help
//!   text in one file), fed by the elections and the job, the leadership
//!   gauges computed at scrape time.
//! - [`shutdown`]: the one place that handles process signals.
//! - [`notify`]: systemd's notify protocol.
//! - [`supervisor`]: the child process (the job, an app check's command):
//!   start, signal, stop, reap; its guard, the separate process that owns
//!   the child's kill deadline and kills what the child leaves behind.
//! - [`reaper`]: zombie reaping when leaderd runs as PID 1.
//! - [`resign`]: the resign command, which HTTP hands the daemon, and its
//!   answer.
//! - [`daemon`]: wiring for `leaderd run`, and its one event loop; the job's
//!   reconcile policy (pure: the election's state in, actions out), step-down
//!   (resign, a failing app check) and signals each in a file of its own.
//! - [`exit`]: the process exit codes.
//! - [`text`]: how values are written into messages (durations, user input, hex).

// No function over 80 lines (.clippy.toml): a longer one hides its steps.
#![warn(clippy::too_many_lines)]

pub mod app_check;
pub mod balance;
pub mod cli;
pub mod clock;
pub mod config;
pub mod core;
pub mod daemon;
pub mod driver;
pub mod election;
pub mod exit;
pub mod http;
pub mod http_client;
pub mod lease;
pub mod metrics;
pub mod notify;
pub mod reaper;
pub mod resign;
pub mod shutdown;
pub mod supervisor;
pub(crate) mod text;
pub mod watch;
