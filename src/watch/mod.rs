//! The watch protocol: a leader streams what it does with its lease to the
//! followers that hold `GET /v1/elections/{election}/watch` open, so they
//! learn of a renewal or a release at once instead of at their next poll.
//!
//! What an event means to a follower, and how far it may be trusted, is the
//! election engine's business (`crate::election`, which also owns
//! [`LeaseEvent`](crate::election::LeaseEvent)); this module only carries
//! events from one daemon to another, in these rooms:
//! - [`wire`]: the format, one JSON event per line, and its line codec;
//!   pure, no I/O;
//! - [`server`]: the leader's end, the streaming answer;
//! - [`client`]: the follower's end, which follows the leader's stream and
//!   hands its events to the node's one channel
//!   ([`HintSink`](crate::election::HintSink));
//! - [`mux`]: with sessions, the follower daemon's end of the leader
//!   daemons' streams (`GET /v1/watch`, one per leader daemon, carrying
//!   its session's writes and every election's events), feeding the
//!   node's elections and its knowledge of the sessions;
//! - [`watchers`]: the sessions named by the daemons that watch this one,
//!   kept only while their stream is open, for balance to look up before
//!   they count.

pub mod client;
pub mod mux;
pub mod server;
pub mod watchers;
pub mod wire;
