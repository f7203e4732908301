//! The node: one daemon's decisions, pure.

mod count;

pub use count::CountBasis;
