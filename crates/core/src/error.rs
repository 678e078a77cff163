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

    /// The same error with `context` in front of its message (`"{context}: {message}"`),
    /// keeping its variant, so the same Python exception. [`Error::Interrupted`] carries no
    /// message and stays as it is.
    pub fn context(self, context: &str) -> Error {
        let wrap = |m: String| format!("{context}: {m}");
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(wrap(m)),
            Error::Type(m) => Error::Type(wrap(m)),
            Error::Runtime(m) => Error::Runtime(wrap(m)),
            Error::Store(m) => Error::Store(wrap(m)),
            Error::Network(m) => Error::Network(wrap(m)),
            Error::Backend(m) => Error::Backend(wrap(m)),
            Error::Interrupted => Error::Interrupted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_error_kind() {
        let e = Error::network("peer 1 hung up").context("[Rank 0] CUDA all_reduce");
        assert_eq!(
            e,
            Error::network("[Rank 0] CUDA all_reduce: peer 1 hung up")
        );
    }
}
