//! One exchange of the wire format (defined in the `ratelimit-protocol` crate): a batch in,
//! its answer out, shared by the HTTP and the gRPC stream transports.

use crate::check::Check;
use crate::store::Store;
pub use ratelimit_protocol::MAX_BODY;
use ratelimit_protocol::{parse_batch, render_reply, BadBatch, CheckResult};

/// Answers one batch: every readable line whose keys lie in the store's keyspace is
/// checked (together, in order); any other line is refused alone (`?`, which the filter
/// never holds against the backend). A rule with an active override is checked under the
/// override's limit instead of the one the gateway sent. The error is for a body that is no
/// batch at all.
pub async fn answer(store: &Store, body: &[u8], out: &mut String) -> Result<(), BadBatch> {
    // A refused line keeps its place (`Some(reason)`); the others are checked together.
    let mut checks: Vec<Check> = Vec::new();
    let mut refused: Vec<Option<String>> = Vec::new();
    let overrides = store.overrides().table();
    for line in parse_batch(body)? {
        match line.and_then(|check| match store.keyspace().refusal(&check) {
            Some(reason) => Err(reason),
            None => Ok(check),
        }) {
            Ok(mut check) => {
                overrides.apply(&mut check);
                checks.push(check);
                refused.push(None);
            }
            Err(reason) => refused.push(Some(reason)),
        }
    }
    let mut outcomes = store.check_all(&checks).await.into_iter();
    let results: Vec<CheckResult> = refused
        .into_iter()
        .map(|refused| {
            if let Some(reason) = refused {
                log::debug!("check refused: {reason}");
                return CheckResult::Refused(reason);
            }
            match outcomes
                .next()
                .unwrap_or_else(|| Err("the store gave no answer".into()))
            {
                Ok((now_ms, rules)) => CheckResult::Checked { now_ms, rules },
                Err(reason) => {
                    log::warn!("check failed: {reason}");
                    CheckResult::Failed(reason)
                }
            }
        })
        .collect();
    render_reply(out, &results);
    Ok(())
}
