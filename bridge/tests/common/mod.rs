//! Test support: a real Valkey per test (from the `test-support` crate), a Redis client
//! connection to it, the native model of the token bucket the Lua script is held to, a
//! three-node cluster, and the bridge binary run as a process.

pub mod buckets;
pub mod client;
pub mod cluster;
pub mod cutter;
pub mod model;
pub mod process;
pub mod rls;
pub mod sentinel;
pub mod server;
pub mod stream;

pub use test_support::Valkey;

/// `message` with gRPC's length prefix, as the body hyper sends.
pub fn prefixed(message: &[u8]) -> bytes::Bytes {
    ratelimit_protocol::prefixed(message).into()
}

/// What the bridge needs of an ACL user, and no more (as docs/operations.md recommends): the
/// script's commands on `rl:` keys (`get` in a cluster, where a call spans slots; `del` for
/// a refund that fills a bucket), PING for /healthz and INFO for the memory policy's
/// check. A cluster adds `cluster|slots`.
pub const BRIDGE_ACL: &[&str] = &[
    "on",
    "resetkeys",
    "~rl:*",
    "resetchannels",
    "-@all",
    "+ping",
    "+evalsha",
    "+script|load",
    "+time",
    "+mget",
    "+get",
    "+exists",
    "+type",
    "+set",
    "+msetex",
    "+del",
    "+info",
];

/// A plain Redis connection for inspecting what the script stored.
pub trait Connect {
    fn connection(&self) -> redis::Connection;
}

impl Connect for Valkey {
    fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }
}
