//! Who may hold how many API connections. Every accepted TCP connection belongs to a
//! peer: on this host the local user whose process opened it (found in `/proc/net/tcp`),
//! elsewhere its address. The daemon's own user (its CLI, the page in its browser) is
//! held only to `--max-connections`; every other peer to `--max-connections-per-peer`,
//! and all of them together to `--max-connections` less a headroom kept for the owner —
//! so no process of another user, and no remote address, can lock the owner out by
//! holding idle WebSockets. A process of the owner's own user can (it can also stop the
//! daemon): see the threat model in ARCHITECTURE.md.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

/// The most API connections at once, by default (`serve --max-connections`).
pub const MAX_CONNECTIONS: u32 = 1024;

/// The most API connections one peer other than the owner holds, by default
/// (`serve --max-connections-per-peer`).
pub const MAX_CONNECTIONS_PER_PEER: u32 = 128;

/// The connection limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// All connections.
    pub max: u32,
    /// Those of one peer other than the owner.
    pub per_peer: u32,
}

impl Limits {
    /// The slots only the owner may take: a sixteenth of the total, at least 2.
    pub fn headroom(&self) -> u32 {
        (self.max / 16).max(2).min(self.max)
    }
}

/// Whose a connection is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A process of the daemon's own user, on this host.
    Owner,
    /// A process of another user on this host (its uid).
    User(u32),
    /// A peer elsewhere (or whose process cannot be told).
    Address(IpAddr),
}

/// Why a connection is refused (answered HTTP 429 with this text).
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refusal {
    /// The peer holds its share.
    #[error(
        "too many connections from this peer: it holds {limit} (serve --max-connections-per-peer); close some first"
    )]
    PeerFull {
        /// The per-peer limit.
        limit: u32,
    },
    /// The slots left are the owner's.
    #[error(
        "too many connections: the daemon's last {headroom} connections are kept for its own user"
    )]
    Reserved {
        /// The headroom.
        headroom: u32,
    },
    /// No slot at all.
    #[error("too many connections: the daemon holds {max} (serve --max-connections)")]
    Full {
        /// The limit.
        max: u32,
    },
}

/// The connections held, by peer.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    owner_uid: u32,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: u32,
    others: u32,
    by_peer: HashMap<Peer, u32>,
}

/// A connection's slot, given back when the last clone is dropped (the connection's task
/// holds one, and a WebSocket's request extensions another for as long as it is open).
#[derive(Debug)]
pub struct Slot {
    admission: Arc<Admission>,
    peer: Peer,
}

impl Admission {
    /// Limits for a daemon running as `owner_uid`.
    pub fn new(limits: Limits, owner_uid: u32) -> Arc<Admission> {
        Arc::new(Admission { limits, owner_uid, held: Mutex::new(Held::default()) })
    }

    /// Who opened the connection from `remote` to `local`.
    pub fn identify(&self, local: SocketAddr, remote: SocketAddr) -> Peer {
        match local_uid(local, remote) {
            Some(uid) if uid == self.owner_uid => Peer::Owner,
            Some(uid) => Peer::User(uid),
            None => Peer::Address(remote.ip()),
        }
    }

    /// A slot for a connection of `peer`, or why there is none.
    pub fn admit(self: &Arc<Self>, peer: Peer) -> Result<Arc<Slot>, Refusal> {
        let Limits { max, per_peer } = self.limits;
        let headroom = self.limits.headroom();
        let mut held = self.lock();
        if held.total >= max {
            return Err(Refusal::Full { max });
        }
        if peer != Peer::Owner {
            if held.by_peer.get(&peer).copied().unwrap_or(0) >= per_peer {
                return Err(Refusal::PeerFull { limit: per_peer });
            }
            if held.others >= max - headroom {
                return Err(Refusal::Reserved { headroom });
            }
            held.others += 1;
            *held.by_peer.entry(peer.clone()).or_default() += 1;
        }
        held.total += 1;
        Ok(Arc::new(Slot { admission: Arc::clone(self), peer }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().expect("UNWRAP: never poisoned")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.admission.lock();
        held.total -= 1;
        if self.peer != Peer::Owner {
            held.others -= 1;
            if let Some(count) = held.by_peer.get_mut(&self.peer) {
                *count -= 1;
                if *count == 0 {
                    held.by_peer.remove(&self.peer);
                }
            }
        }
    }
}

/// The uid of the process on this host whose socket is `remote` connected to `local`, if
/// it is one (`/proc/net/tcp` or `tcp6`: the peer's socket has them the other way round).
fn local_uid(local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let table = match remote {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let (theirs, ours) = (proc_address(remote), proc_address(local));
    let text = std::fs::read_to_string(table).ok()?;
    text.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&theirs.as_str()) && fields.get(2) == Some(&ours.as_str()))
            .then(|| fields.get(7)?.parse().ok())
            .flatten()
    })
}

/// An address as the kernel's socket tables print it: each 32-bit word of the address in
/// host order, in hex, then the port.
fn proc_address(addr: SocketAddr) -> String {
    let octets: Vec<u8> = match addr.ip() {
        IpAddr::V4(ip) => ip.octets().to_vec(),
        IpAddr::V6(ip) => ip.octets().to_vec(),
    };
    let mut text = String::with_capacity(octets.len() * 2 + 5);
    for word in octets.chunks(4) {
        let word = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        for byte in word.to_ne_bytes() {
            text.push_str(&format!("{byte:02X}"));
        }
    }
    text.push_str(&format!(":{:04X}", addr.port()));
    text
}

/// A connection's gate: with a slot, each request passes carrying it (so an upgraded
/// WebSocket keeps it); without one, each is answered HTTP 429 saying why.
pub struct SlotGate(pub Result<Arc<Slot>, Refusal>);

impl agentctl::server::Gate for SlotGate {
    fn refuse(&self, _headers: &http::HeaderMap) -> Option<(http::StatusCode, &'static str)> {
        self.0.is_err().then_some((http::StatusCode::TOO_MANY_REQUESTS, "too many connections"))
    }

    fn admit(
        &self,
        _headers: &http::HeaderMap,
        extensions: &mut http::Extensions,
    ) -> Result<(), (http::StatusCode, String)> {
        match &self.0 {
            Ok(slot) => {
                extensions.insert(Arc::clone(slot));
                Ok(())
            }
            Err(refusal) => Err((http::StatusCode::TOO_MANY_REQUESTS, refusal.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_share_others_leave_the_headroom_and_slots_come_back() {
        let admission = Admission::new(Limits { max: 12, per_peer: 4 }, 1000);
        let peer = |uid| Peer::User(uid);
        let first: Vec<_> = (0..4).map(|_| admission.admit(peer(1)).unwrap()).collect();
        assert!(matches!(admission.admit(peer(1)), Err(Refusal::PeerFull { limit: 4 })));
        let second: Vec<_> = (0..4).map(|_| admission.admit(peer(2)).unwrap()).collect();
        let _third: Vec<_> = (0..2).map(|_| admission.admit(peer(3)).unwrap()).collect();
        assert!(matches!(admission.admit(peer(3)), Err(Refusal::Reserved { headroom: 2 })));
        let owner: Vec<_> = (0..2).map(|_| admission.admit(Peer::Owner).unwrap()).collect();
        assert!(matches!(admission.admit(Peer::Owner), Err(Refusal::Full { max: 12 })));
        drop(owner);
        drop(first);
        drop(second);
        assert!(admission.admit(peer(1)).is_ok(), "dropped slots are given back");
        assert_eq!(admission.lock().by_peer.get(&peer(2)), None);
    }

    #[test]
    fn addresses_are_written_as_the_kernel_tables_write_them() {
        assert_eq!(proc_address("127.0.0.1:8080".parse().unwrap()), "0100007F:1F90");
        assert_eq!(
            proc_address("[::1]:22".parse().unwrap()),
            "00000000000000000000000001000000:0016"
        );
    }

    #[test]
    fn a_loopback_connection_is_told_by_its_users_uid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_, remote) = listener.accept().unwrap();
        assert_eq!(remote, client.local_addr().unwrap());
        let me = nix::unistd::geteuid().as_raw();
        let admission = Admission::new(Limits { max: 4, per_peer: 1 }, me);
        assert_eq!(admission.identify(listener.local_addr().unwrap(), remote), Peer::Owner);
        let other = Admission::new(Limits { max: 4, per_peer: 1 }, me + 1);
        assert_eq!(other.identify(listener.local_addr().unwrap(), remote), Peer::User(me));
    }
}
