//! Typed errors of the engine. Each variant maps to one Python exception in the binding crate.

use thiserror::Error;

/// Every error the engine reports. `Clone` because one failure is handed to every pending Work
/// of a group (errors are sticky).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum Error {
    /// A bad argument (torch raises `ValueError`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A wrong type, e.g. an unsupported dtype for an op (torch raises `TypeError`).
    #[error("{0}")]
    Type(String),
    /// Misuse of the API or an unsupported combination (torch raises `RuntimeError`).
    #[error("{0}")]
    Runtime(String),
    /// A store failed or timed out (`DistStoreError`).
    #[error("{0}")]
    Store(String),
    /// A peer died, hung up or sent garbage (`DistNetworkError`).
    #[error("{0}")]
    Network(String),
    /// A collective failed: timeout, mismatch between ranks, aborted group (`DistBackendError`).
    #[error("{0}")]
    Backend(String),
    /// A blocking call on an interruptible thread was interrupted (`KeyboardInterrupt`).
    #[error("interrupted")]
    Interrupted,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
    pub fn network(msg: impl Into<String>) -> Self {
        Error::Network(msg.into())
    }
    pub fn backend(msg: impl Into<String>) -> Self {
        Error::Backend(msg.into())
    }
    pub fn store(msg: impl Into<String>) -> Self {
        Error::Store(msg.into())
    }
}
