//! In-memory transport between threads of one process, for tests of the algorithms.
