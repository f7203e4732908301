//! How the watch clients reach a daemon's node: every client hands what
//! it brings to one channel ([`HintSink`]), tagged with its election, and
//! the node's elections say where to watch through one [`Aim`]. What a
//! hint means is the core's (`crate::core::hints`).

use tokio::sync::{mpsc, watch};

use crate::core::hints::Hint;
use crate::core::node::{ElectionId, NodeInput};

/// What the one channel holds for the node's driver; beyond that new
/// hints are dropped (the elections read the store anyway).
pub const HINT_CHANNEL: usize = 4096;

/// The sending end of the one channel every watch client of a daemon
/// hands its hints (and, with sessions, what the streams tell of the
/// sessions) to, for the node's driver.
#[derive(Debug, Clone)]
pub struct HintSink(mpsc::Sender<NodeInput>);

impl HintSink {
    /// A sink, and the receiving end the driver takes.
    pub fn channel() -> (HintSink, mpsc::Receiver<NodeInput>) {
        let (tx, rx) = mpsc::channel(HINT_CHANNEL);
        (HintSink(tx), rx)
    }

    /// Hand `hint` to `election`; dropped when the channel is full.
    pub fn hint(&self, election: ElectionId, hint: Hint) {
        self.input(NodeInput::Hint { election, hint });
    }

    /// Hand the node `input` (a session told of, a stream ended);
    /// dropped when the channel is full.
    pub fn input(&self, input: NodeInput) {
        // Full: the driver is busy; what is dropped is read from the store.
        let _ = self.0.try_send(input);
    }
}

/// Where the node's elections watch: each names its leader's advertised
/// address, or nothing.
pub trait Aim: Send + Sync {
    /// Election `election` (named `name`) watches `address` from now on;
    /// `None`: nothing.
    fn aim(&self, election: ElectionId, name: &str, address: Option<String>);
}

/// One watch client per election (without sessions), each told its
/// address on a channel of its own, in the elections' order; a client
/// ends when its channel is dropped.
#[derive(Debug, Default)]
pub struct Clients(pub Vec<watch::Sender<Option<String>>>);

impl Aim for Clients {
    fn aim(&self, election: ElectionId, _name: &str, address: Option<String>) {
        if let Some(tx) = self.0.get(election.index()) {
            tx.send_if_modified(|t| {
                let changed = *t != address;
                *t = address;
                changed
            });
        }
    }
}
