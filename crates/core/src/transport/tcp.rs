//! TCP transport: a full mesh of sockets between the ranks of a group.
