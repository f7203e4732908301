//! The election task's end of a watch client: where it is told to aim,
//! and the channel the hints arrive on. What a hint means is the core's
//! (`crate::core::hints`).

use tokio::sync::{mpsc, watch};

use crate::core::hints::Hint;

/// The engine's side of a watch client: it says where to watch (the
/// leader's advertised address, or nowhere) and receives what arrives.
#[derive(Debug)]
pub struct HintFeed {
    /// Where the engine's word goes.
    pub target: Target,
    /// What arrived, in order.
    pub hints: mpsc::Receiver<Hint>,
}

/// Where a feed is told the address to watch.
#[derive(Debug)]
pub enum Target {
    /// A watch client of the feed's own, told through this channel.
    Channel(watch::Sender<Option<String>>),
    /// A client shared by many feeds (the daemons' streams, with
    /// sessions), told at once; dropping it takes the feed out.
    Shared(Box<dyn Aim>),
}

/// A shared watch client's side of one feed.
pub trait Aim: Send + Sync + std::fmt::Debug {
    /// Watch `address` from now on; `None`: nothing.
    fn aim(&self, address: Option<String>);
}

impl HintFeed {
    /// Watch `address` from now on; `None`: nothing.
    pub fn aim(&self, address: Option<String>) {
        match &self.target {
            Target::Channel(tx) => {
                tx.send_if_modified(|t| {
                    let changed = *t != address;
                    *t = address;
                    changed
                });
            }
            Target::Shared(shared) => shared.aim(address),
        }
    }
}
