//! rustdist-core: the collective-communication engine behind `rustdist`.
//!
//! Pure Rust, no Python: stores (TCP, file, hash, prefix), transports (TCP mesh), collective
//! algorithms written against [`transport::Transport`], and process groups that run every
//! collective as a [`work::Work`] on the group's own worker thread.

pub mod algorithms;
pub mod auth;
pub mod cancel;
pub mod cuda;
pub mod error;
pub mod group;
pub mod interrupt;
pub mod netio;
pub mod recorder;
pub mod reduce;
pub mod spin;
pub mod store;
pub mod tensor;
#[cfg(test)]
mod testutil;
pub mod timeout;
pub mod tls;
pub mod transport;
pub mod types;
pub mod wake;
pub mod work;

pub use error::{Error, Result};
pub use group::ProcessGroup;
pub use types::{CollectiveKind, DType, ReduceOp};
pub use work::Work;
