//! The connection to one Redis server: the server `--redis` names, or the master that Redis
//! Sentinels name (`--sentinel`), which is the same connection, moved when they name
//! another. It is one multiplexed connection (redis-rs's `ConnectionManager`): it pipelines
//! concurrent commands, never re-sends one, and reconnects by itself after I/O errors, but
//! only to the address it was made for, and not after a refused login: once Redis refused
//! its credentials it would keep failing, even after the server accepts them (a password
//! rotation done in the wrong order, then fixed). So the health loop remakes it after a
//! refused login, and, with sentinels, makes it anew for the master they name after a
//! failover (`follow`).

use super::sentinel::{self, Role, Sentinels};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// A command that finds no master known looks for one itself (the first check, a
/// command-line tool) unless a look failed this recently: then it fails with that look's
/// reason, so that a burst of checks does not queue up questions to the sentinels.
const LOOK_GAP: Duration = Duration::from_millis(250);
/// The health loop looks for the master at once when a command meets a failover's trouble,
/// but no more often than this.
const TROUBLE_GAP: Duration = Duration::from_millis(100);

/// One server's connection; cheap to clone.
#[derive(Clone)]
pub struct Single {
    /// The connection and the node it was made for; `None` until the sentinels named a
    /// master.
    dialed: Arc<RwLock<Option<Dialed>>>,
    config: ConnectionManagerConfig,
    /// With `--sentinel`: who says where the master is.
    following: Option<Arc<Following>>,
}

#[derive(Clone)]
struct Dialed {
    /// The master's `host:port` (with `--sentinel`), which names its metrics and lane.
    address: Arc<str>,
    /// What the connection is made from again after a refused login.
    client: redis::Client,
    conn: ConnectionManager,
}

struct Following {
    sentinels: Sentinels,
    /// Held while the master is looked for, one look at a time; when the last look that
    /// found none ended, and why it found none.
    looking: tokio::sync::Mutex<Option<(Instant, String)>>,
    /// Woken by a command's failure that a failover explains (`READONLY` from a master
    /// turned replica, a lost connection): the health loop then looks at once.
    trouble: Notify,
    /// Whether the last look found no sentinel to answer while the master did (said once).
    unanswered: AtomicBool,
}

impl Single {
    /// The server `client` reaches (its TLS and credentials: see `connect`). Prepares the
    /// connection without dialing: the bridge starts (and reports unhealthy) even while
    /// Redis is down.
    pub fn new(client: redis::Client, config: ConnectionManagerConfig) -> RedisResult<Single> {
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        let dialed = Dialed {
            address: Arc::from("single"),
            client,
            conn,
        };
        Ok(Single {
            dialed: Arc::new(RwLock::new(Some(dialed))),
            config,
            following: None,
        })
    }

    /// The master `sentinels` name, found on first use (or by the health loop).
    pub fn following(sentinels: Sentinels, config: ConnectionManagerConfig) -> Single {
        Single {
            dialed: Arc::default(),
            config,
            following: Some(Arc::new(Following {
                sentinels,
                looking: tokio::sync::Mutex::default(),
                trouble: Notify::new(),
                unanswered: AtomicBool::new(false),
            })),
        }
    }

    fn current(&self) -> Option<Dialed> {
        self.dialed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection to send a command on; with sentinels and no master known yet, found
    /// first.
    pub async fn conn(&self) -> RedisResult<ConnectionManager> {
        if let Some(dialed) = self.current() {
            return Ok(dialed.conn);
        }
        let Some(following) = &self.following else {
            return Err((ErrorKind::Client, "no connection").into());
        };
        let mut looking = following.looking.lock().await;
        let recent = looking
            .as_ref()
            .filter(|(at, _)| at.elapsed() < LOOK_GAP)
            .map(|(_, why)| why.clone());
        let found = match (self.current(), &recent) {
            (Some(dialed), _) => return Ok(dialed.conn),
            (None, Some(why)) => Err(why.clone()),
            (None, None) => self.look(following).await,
        };
        if recent.is_none() {
            *looking = found
                .as_ref()
                .err()
                .map(|why| (Instant::now(), why.clone()));
        }
        match found {
            Ok(()) => self
                .current()
                .map(|dialed| dialed.conn)
                .ok_or_else(|| no_master("no master known".into())),
            Err(why) => Err(no_master(why)),
        }
    }

    /// With sentinels: asks them where the master is now and moves the connection there
    /// if it moved (or if the master stopped answering as one); why no master answers,
    /// if none does. Without: nothing to do.
    pub async fn follow(&self) -> Result<(), String> {
        let Some(following) = &self.following else {
            return Ok(());
        };
        let mut looking = following.looking.lock().await;
        let found = self.look(following).await;
        *looking = found
            .as_ref()
            .err()
            .map(|why| (Instant::now(), why.clone()));
        found
    }

    /// One look for the master (`looking` held). The current master stays while it says it
    /// is one and the sentinels name no other; otherwise the connection moves to the first
    /// node the sentinels name that says it is a master (the same one, remade, if it only
    /// refused a login or came back).
    async fn look(&self, following: &Following) -> Result<(), String> {
        let current = self.current();
        let role = async {
            match &current {
                Some(dialed) => sentinel::role(&mut dialed.conn.clone()).await,
                None => Err("no master known yet".into()),
            }
        };
        let (role, named) = tokio::join!(role, following.sentinels.ask());
        if named.is_ok() && following.unanswered.swap(false, Ordering::Relaxed) {
            log::info!("the sentinels answer again");
        }
        if let (Some(dialed), Ok(Role::Master)) = (&current, &role) {
            match &named {
                Ok(candidates) if candidates.first().is_some_and(|c| same(c, &dialed.address)) => {
                    return Ok(())
                }
                // The master that answers is kept; a failover is noticed once they answer.
                Err(e) => {
                    if !following.unanswered.swap(true, Ordering::Relaxed) {
                        log::warn!("{e}; keeping the master {}", dialed.address);
                    }
                    return Ok(());
                }
                Ok(_) => {}
            }
        }
        let candidates = named?;
        match following.sentinels.verify(&candidates).await {
            Ok((address, client)) => {
                let moved = current.as_ref().is_none_or(|d| d.address != address);
                if moved || role.is_err() {
                    self.dial(address, client, current.as_ref().map(|d| &*d.address))
                        .map_err(|e| format!("sentinel: {e}"))?;
                }
                Ok(())
            }
            // The node the sentinels name is not a master yet; the one that is, stays.
            Err(_) if matches!(role, Ok(Role::Master)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn dial(&self, address: Arc<str>, client: redis::Client, was: Option<&str>) -> RedisResult<()> {
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), self.config.clone())?;
        let name = self.following.as_ref().map_or("", |f| f.sentinels.name());
        match was {
            Some(was) if *was != *address => {
                log::warn!("redis master {name:?} moved: now {address}, was {was}")
            }
            Some(_) => log::info!("redis master {name:?}: connecting to {address} again"),
            None => log::info!("redis master {name:?} is {address}"),
        }
        let dialed = Dialed {
            address,
            client,
            conn,
        };
        *self.dialed.write().unwrap_or_else(PoisonError::into_inner) = Some(dialed);
        Ok(())
    }

    /// Whether the server answers now: `PING`, or with sentinels `ROLE` saying master (a
    /// master turned replica refuses every write). A refused login remakes the connection.
    pub async fn ping(&self) -> bool {
        let Some(dialed) = self.current() else {
            return false;
        };
        let mut conn = dialed.conn.clone();
        if self.following.is_some() {
            return matches!(sentinel::role(&mut conn).await, Ok(Role::Master));
        }
        match conn.req_packed_command(&redis::cmd("PING")).await {
            Ok(_) => true,
            Err(e) => {
                if e.kind() == ErrorKind::AuthenticationFailed {
                    match ConnectionManager::new_lazy_with_config(
                        dialed.client,
                        self.config.clone(),
                    ) {
                        Ok(fresh) => {
                            let mut current =
                                self.dialed.write().unwrap_or_else(PoisonError::into_inner);
                            if let Some(current) = current.as_mut() {
                                current.conn = fresh;
                            }
                        }
                        Err(e) => log::warn!("cannot remake the redis connection: {e}"),
                    }
                }
                false
            }
        }
    }

    /// A command failed with `e`: with sentinels, if a failover may explain it, the
    /// health loop looks for the master now rather than at its next round.
    pub fn trouble(&self, e: &RedisError) {
        let Some(following) = &self.following else {
            return;
        };
        if e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            following.trouble.notify_one();
        }
    }

    /// Waits `pause`, or with sentinels until a command meets trouble (`trouble`).
    pub async fn idle(&self, pause: Duration) {
        match &self.following {
            None => tokio::time::sleep(pause).await,
            Some(following) => {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = following.trouble.notified() => tokio::time::sleep(TROUBLE_GAP).await,
                }
            }
        }
    }

    /// The master's `host:port` (with sentinels, once known).
    pub fn master(&self) -> Option<Arc<str>> {
        self.following.as_ref()?;
        self.current().map(|d| d.address)
    }
}

fn same((host, port): &sentinel::Address, address: &str) -> bool {
    address
        .rsplit_once(':')
        .is_some_and(|(h, p)| h == host && p.parse() == Ok(*port))
}

fn no_master(why: String) -> RedisError {
    (ErrorKind::MasterNameNotFoundBySentinel, "no master", why).into()
}
