//! Links on demand, the mesh's side (the connections are made in `tcp::OnDemand`): a peer
//! without a link is linked before the first frame goes to it or the first receive waits on
//! it, and the links peers made to this rank are taken, their TLS handshakes finished by the
//! accepting thread, at each sweep, or as soon as that thread wakes a sleeping poll.

use std::time::Instant;

use super::link::Connection;
use super::state::MeshTransport;
use crate::error::Result;
use crate::interrupt;

impl MeshTransport {
    /// Makes sure peer `p` has a link, dialling it if need be, before `deadline`; a failure
    /// (the peer has exited, the group was aborted meanwhile) fails the transport.
    pub(super) fn link(&mut self, p: usize, deadline: Instant) -> Result<()> {
        if self.peer(p)?.link.linked() {
            return Ok(());
        }
        let Some(on_demand) = self.on_demand.as_ref() else {
            return Ok(());
        };
        let cancel = self.cancel.clone();
        let stop = || cancel.is_raised() || interrupt::check().is_err();
        match on_demand.link(p, deadline, &stop) {
            Ok(link) => {
                self.install(p, link);
                // A link this rank dialled shakes hands now, every stream of it (the peer's
                // accepting thread waits for all of them, and a frame may use only one).
                self.finish_handshakes(p..p + 1, deadline)
                    .map_err(|e| self.fail(e))
            }
            Err(e) => {
                // What stopped the dial is the error to report.
                if let Err(raised) = self.cancel.check() {
                    return Err(self.fail(raised));
                }
                interrupt::check()?;
                Err(self.fail(e))
            }
        }
    }

    /// Takes the links peers made to this rank; returns those peers. A link whose setup
    /// failed fails the transport.
    pub(super) fn take_arrivals(&mut self) -> Vec<usize> {
        let Some(on_demand) = self.on_demand.as_ref() else {
            return Vec::new();
        };
        let arrived = on_demand.arrivals();
        arrived
            .into_iter()
            .map(|(p, link)| {
                match link {
                    Ok(link) => self.install(p, link),
                    Err(e) => {
                        self.fail(e);
                    }
                }
                p
            })
            .collect()
    }

    fn install(&mut self, p: usize, link: Connection) {
        if let Some(peer) = self.peers[p].as_mut() {
            peer.link = link;
        }
    }
}
