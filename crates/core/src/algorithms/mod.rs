//! Collective algorithms, one file per algorithm, all written against `transport::Transport`.
