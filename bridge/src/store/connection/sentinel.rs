//! Redis Sentinel (`--sentinel NAME`): where the master named NAME is now. A replicated
//! Redis moves its master when it fails over, and only its sentinels know where to; the
//! bridge asks every sentinel (`SENTINEL get-master-addr-by-name`), takes the address most
//! of them give, and writes to it only once the node itself says it is a master (`ROLE`):
//! during a failover a sentinel may still name the old master, and a node that comes back
//! may still think it is one. The connection to the master is the single server's (see
//! `single`), moved when the sentinels name another.
//!
//! The sentinels are the operator's, but what they answer is still read strictly: a reply
//! that is not an address, a port out of range or a role nobody knows is an error naming
//! the sentinel or the node, never a panic, and never a connection to a made-up address.

use super::connect::{NodeAccess, SentinelClients};
use futures_util::future::join_all;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Value};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The longest host name a sentinel may give (DNS's bound).
const MAX_HOST: usize = 253;
/// How much of a garbled reply an error message quotes.
const QUOTED: usize = 120;

/// The sentinels of one master, and how to reach the master they name.
pub struct Sentinels {
    /// The master's name in the sentinels' configuration (`sentinel monitor NAME ...`).
    name: String,
    sentinels: Vec<Sentinel>,
    /// Credentials and TLS of the master; its address comes from the sentinels.
    master: NodeAccess,
    /// Timeouts of every connection to a sentinel, and of the check of a master's role.
    config: AsyncConnectionConfig,
}

struct Sentinel {
    /// `host:port`, for logs and errors.
    address: String,
    client: redis::Client,
    /// Kept between questions (the health loop asks every half second); dropped after a
    /// failure, so the next question dials again.
    conn: Mutex<Option<MultiplexedConnection>>,
}

/// What a node says it is (`ROLE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Master,
    Replica,
    Sentinel,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Master => "master",
            Role::Replica => "replica",
            Role::Sentinel => "sentinel",
        })
    }
}

/// A master's address as a sentinel gives it.
pub type Address = (String, u16);

impl Sentinels {
    /// The sentinels of `clients`, watching the master called `name`; each connection and
    /// each question bounded by `connect_timeout` and `response_timeout`.
    pub fn new(
        name: &str,
        clients: SentinelClients,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Sentinels, String> {
        if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control()) {
            return Err(format!("--sentinel: {name:?} is no master name"));
        }
        Ok(Sentinels {
            name: name.to_string(),
            sentinels: clients
                .sentinels
                .into_iter()
                .map(|(address, client)| Sentinel {
                    address,
                    client,
                    conn: Mutex::default(),
                })
                .collect(),
            master: clients.master,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(response_timeout)),
        })
    }

    /// The master's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every address the sentinels give for the master, the one most of them give first;
    /// or why none gives one (none answers, none knows the name).
    pub async fn ask(&self) -> Result<Vec<Address>, String> {
        let answers = join_all(self.sentinels.iter().map(|s| self.ask_one(s))).await;
        rank(
            &self.name,
            self.sentinels
                .iter()
                .map(|s| s.address.as_str())
                .zip(answers),
        )
    }

    async fn ask_one(&self, sentinel: &Sentinel) -> Result<Option<Address>, String> {
        let cached = sentinel
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut conn = match cached {
            Some(conn) => conn,
            None => {
                let conn = sentinel
                    .client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
                    .map_err(|e| e.to_string())?;
                *sentinel.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
                conn
            }
        };
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("get-master-addr-by-name").arg(&self.name);
        match cmd.query_async::<Value>(&mut conn).await {
            Ok(reply) => master_address(&reply),
            Err(e) => {
                if e.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) {
                    *sentinel.conn.lock().unwrap_or_else(PoisonError::into_inner) = None;
                }
                Err(if e.to_string().contains("unknown command") {
                    format!("not a sentinel ({e})")
                } else {
                    e.to_string()
                })
            }
        }
    }

    /// The first of `candidates` that says it is a master, with a client for it; or what
    /// each of them is instead.
    pub async fn verify(
        &self,
        candidates: &[Address],
    ) -> Result<(Arc<str>, redis::Client), String> {
        let mut found = Vec::new();
        for (host, port) in candidates {
            let address = format!("{host}:{port}");
            let client = self.master.client(host, *port)?;
            let role = async {
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
                    .map_err(|e| e.to_string())?;
                role(&mut conn).await
            };
            match role.await {
                Ok(Role::Master) => return Ok((Arc::from(address), client)),
                Ok(other) => found.push(format!("{address} is a {other}")),
                Err(e) => found.push(format!("{address}: {e}")),
            }
        }
        Err(format!(
            "sentinel: no node the sentinels name for {:?} is a master ({})",
            self.name,
            found.join("; ")
        ))
    }
}

/// What the node on `conn` says it is.
pub async fn role(conn: &mut impl ConnectionLike) -> Result<Role, String> {
    let reply: Value = redis::cmd("ROLE")
        .query_async(conn)
        .await
        .map_err(|e| format!("ROLE: {e}"))?;
    read_role(&reply)
}

/// A `ROLE` reply: an array whose first element names the role.
pub fn read_role(reply: &Value) -> Result<Role, String> {
    let first = match reply {
        Value::Array(items) => items.first(),
        _ => None,
    };
    match first.and_then(text) {
        Some("master") => Ok(Role::Master),
        Some("slave" | "replica") => Ok(Role::Replica),
        Some("sentinel") => Ok(Role::Sentinel),
        _ => Err(format!("ROLE answered {}", quote(reply))),
    }
}

/// A `SENTINEL get-master-addr-by-name` reply: `[host, port]`, or nil when the sentinel
/// watches no master of that name.
pub fn master_address(reply: &Value) -> Result<Option<Address>, String> {
    let garbled = || format!("answered {} for the master's address", quote(reply));
    let items = match reply {
        Value::Nil => return Ok(None),
        Value::Array(items) => items,
        _ => return Err(garbled()),
    };
    let [host, port] = items.as_slice() else {
        return Err(garbled());
    };
    let host = text(host)
        .filter(|h| !h.is_empty() && h.len() <= MAX_HOST)
        .filter(|h| {
            h.chars()
                .all(|c| c.is_ascii_graphic() && !"/@?#".contains(c))
        })
        .ok_or_else(garbled)?;
    let port = match port {
        Value::Int(n) => u16::try_from(*n).ok(),
        other => text(other).and_then(|p| p.parse::<u16>().ok()),
    }
    .filter(|&p| p != 0)
    .ok_or_else(garbled)?;
    Ok(Some((host.to_string(), port)))
}

/// Each sentinel's answer, ranked: every address given, the most often given first (ties
/// in the sentinels' order); or, when none gave one, an error saying what each said.
fn rank<'a>(
    name: &str,
    answers: impl Iterator<Item = (&'a str, Result<Option<Address>, String>)>,
) -> Result<Vec<Address>, String> {
    let mut named: Vec<(Address, usize)> = Vec::new();
    let mut said = Vec::new();
    let mut unknown = false;
    for (sentinel, answer) in answers {
        match answer {
            Ok(Some(address)) => match named.iter_mut().find(|(a, _)| *a == address) {
                Some((_, votes)) => *votes += 1,
                None => named.push((address, 1)),
            },
            Ok(None) => {
                unknown = true;
                said.push(format!("{sentinel}: no such master"));
            }
            Err(e) => said.push(format!("{sentinel}: {e}")),
        }
    }
    if named.is_empty() {
        let why = if unknown {
            format!("no sentinel knows a master named {name:?}")
        } else {
            "no sentinel answers".to_string()
        };
        return Err(format!("sentinel: {why} ({})", said.join("; ")));
    }
    named.sort_by_key(|(_, votes)| std::cmp::Reverse(*votes));
    Ok(named.into_iter().map(|(address, _)| address).collect())
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// `value` for an error message, cut short.
fn quote(value: &Value) -> String {
    let mut text = format!("{value:?}");
    if text.len() > QUOTED {
        let mut end = QUOTED;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_master_address_is_a_host_and_a_port() {
        let reply = Value::Array(vec![bulk("10.0.0.7"), bulk("6379")]);
        assert_eq!(
            master_address(&reply).unwrap(),
            Some(("10.0.0.7".to_string(), 6379))
        );
        assert_eq!(master_address(&Value::Nil).unwrap(), None);
    }

    #[test]
    fn garbage_for_an_address_is_an_error() {
        let long = "h".repeat(300);
        for bad in [
            Value::Int(1),
            Value::Okay,
            Value::Array(vec![]),
            Value::Array(vec![bulk("h")]),
            Value::Array(vec![bulk("h"), bulk("1"), bulk("2")]),
            Value::Array(vec![bulk(""), bulk("6379")]),
            Value::Array(vec![bulk("h"), bulk("0")]),
            Value::Array(vec![bulk("h"), bulk("65536")]),
            Value::Array(vec![bulk("h"), bulk("-1")]),
            Value::Array(vec![bulk("h"), bulk("port")]),
            Value::Array(vec![bulk("h"), Value::Int(-5)]),
            Value::Array(vec![bulk("evil host"), bulk("1")]),
            Value::Array(vec![bulk("u:p@h"), bulk("1")]),
            Value::Array(vec![bulk(&long), bulk("1")]),
            Value::Array(vec![Value::BulkString(vec![0xff, 0xfe]), bulk("1")]),
            Value::Array(vec![Value::Nil, Value::Nil]),
        ] {
            let err = master_address(&bad).unwrap_err();
            assert!(err.contains("for the master's address"), "{bad:?}: {err}");
            assert!(err.len() < 200, "{err}");
        }
    }

    #[test]
    fn roles_are_read_from_the_first_element() {
        let master = Value::Array(vec![bulk("master"), Value::Int(0), Value::Array(vec![])]);
        assert_eq!(read_role(&master).unwrap(), Role::Master);
        let replica = Value::Array(vec![bulk("slave"), bulk("h"), Value::Int(1)]);
        assert_eq!(read_role(&replica).unwrap(), Role::Replica);
        let sentinel = Value::Array(vec![bulk("sentinel"), Value::Array(vec![])]);
        assert_eq!(read_role(&sentinel).unwrap(), Role::Sentinel);
        for bad in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![bulk("boss")]),
            Value::Array(vec![Value::Int(1)]),
            bulk("master"),
        ] {
            assert!(read_role(&bad).unwrap_err().starts_with("ROLE answered"));
        }
    }

    fn at(host: &str, port: u16) -> Address {
        (host.to_string(), port)
    }

    #[test]
    fn the_address_most_sentinels_give_comes_first() {
        let answers = vec![
            ("s1", Ok(Some(at("old", 1)))),
            ("s2", Ok(Some(at("new", 2)))),
            ("s3", Err("connection refused".to_string())),
            ("s4", Ok(Some(at("new", 2)))),
            ("s5", Ok(None)),
        ];
        let ranked = rank("m", answers.into_iter()).unwrap();
        assert_eq!(ranked, vec![at("new", 2), at("old", 1)]);
    }

    #[test]
    fn no_address_says_why() {
        let unknown = vec![("s1", Ok(None)), ("s2", Err("timed out".to_string()))];
        let err = rank("mymaster", unknown.into_iter()).unwrap_err();
        assert!(
            err.contains("no sentinel knows a master named \"mymaster\""),
            "{err}"
        );
        assert!(err.contains("s2: timed out"), "{err}");
        let down = vec![("s1", Err("refused".to_string()))];
        let err = rank("m", down.into_iter()).unwrap_err();
        assert_eq!(err, "sentinel: no sentinel answers (s1: refused)");
    }

    #[test]
    fn a_master_name_must_be_one() {
        for bad in ["", "a\nb"] {
            let clients = SentinelClients {
                sentinels: Vec::new(),
                master: crate::store::connection::connect::RedisAccess::default()
                    .sentinel(&["redis://h:1".to_string()], &Default::default())
                    .unwrap()
                    .master,
            };
            let err = Sentinels::new(bad, clients, Duration::ZERO, Duration::ZERO).err();
            assert!(err.unwrap().contains("no master name"));
        }
    }
}
