//! Notices that Redis is back before a check has to. The connection reconnects only when a
//! command fails on it, and gives up after a couple of attempts while Redis is down; left
//! alone, the first check after Redis returns would fail on the dead connection and only
//! set off the reconnection (a gateway answering 503 seconds after Redis was back). So the
//! bridge pings Redis in the background: often while it does not answer, so the connection
//! is remade within a fraction of a second of Redis returning, and now and then while it
//! does, so a restart is noticed even when no check came in meanwhile. Each time Redis
//! answers after it did not (and at start), its memory policy is judged (`redis_memory`):
//! a restarted Redis may come back with another configuration.
//!
//! With sentinels, each round first asks them where the master is (`Store::follow`), so
//! the connection moves to a new master within a round of the sentinels naming it, and
//! at once when a check meets a master turned replica or a lost connection.

use crate::store::redis_memory;
use crate::store::Store;
use std::time::Duration;

/// Between pings while Redis answers: also bounds how long a restart of Redis that no check
/// saw goes unnoticed.
const WHILE_HEALTHY: Duration = Duration::from_millis(500);
/// Between pings while it does not.
const WHILE_UNHEALTHY: Duration = Duration::from_millis(250);

/// Pings Redis for as long as it runs, logging when it goes away and comes back.
pub async fn watch(store: Store) {
    let mut healthy = true;
    // Whether Redis's memory policy is to be judged at its next answer, and the warning
    // given last (each is said once, not at every return of Redis).
    let (mut judge, mut warned) = (true, None);
    let mut first_node = None;
    loop {
        let followed = store.follow().await;
        let now = followed.is_ok() && store.ping().await;
        if now {
            // A failover or a resharding moves slots without a check noticing at once.
            let node = store.read_topology().await.name(0);
            // Another node (a Sentinel master after a failover that failed no ping) has a
            // configuration of its own.
            judge |= first_node.replace(node.clone()).is_some_and(|n| n != node);
            if judge {
                judge = !redis_memory::judge(&store, &mut warned).await;
            }
        } else {
            judge = true;
        }
        if now != healthy {
            if now {
                log::info!("redis answers again");
            } else {
                let why = followed.err().map_or(String::new(), |e| format!(" ({e})"));
                log::warn!("redis does not answer{why}; checking again every {WHILE_UNHEALTHY:?}");
            }
            healthy = now;
        }
        let pause = if healthy {
            WHILE_HEALTHY
        } else {
            WHILE_UNHEALTHY
        };
        store.idle(pause).await;
    }
}
