//! A worker's callouts out: what Envoy's id for each stands for, by the request that sent
//! it (Envoy numbers a request's callouts on their own). Thread-local: a request's
//! callouts are its worker's. Ordered by request, so that one request's are found without
//! reading the others' (a worker may have thousands out).

use crate::courier::Callout;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// A callout out.
enum Out {
    /// A request's own check: the dispatcher's token.
    Check(u32),
    /// A batch of the worker's that a request carries (a response's end its settlement),
    /// kept to be sent again by the courier should the request go first.
    Carried(Callout),
}

impl Out {
    fn token(&self) -> u32 {
        match self {
            Out::Check(token) => *token,
            Out::Carried(callout) => callout.token,
        }
    }
}

thread_local! {
    static OUT: RefCell<BTreeMap<(u32, u64), Out>> = const { RefCell::new(BTreeMap::new()) };
}

/// Records request `context_id`'s own check, which Envoy calls `envoy_id` and the
/// dispatcher `token`.
pub fn sent(context_id: u32, envoy_id: u64, token: u32) {
    OUT.with_borrow_mut(|out| out.insert((context_id, envoy_id), Out::Check(token)));
}

/// Records a batch request `context_id` carries, which Envoy calls `envoy_id`.
pub fn carried(context_id: u32, envoy_id: u64, callout: Callout) {
    OUT.with_borrow_mut(|out| out.insert((context_id, envoy_id), Out::Carried(callout)));
}

/// Every key of request `context_id`'s callouts.
fn of(context_id: u32) -> RangeInclusive<(u32, u64)> {
    (context_id, 0)..=(context_id, u64::MAX)
}

/// Whether request `context_id` has callouts out.
pub fn carries(context_id: u32) -> bool {
    OUT.with_borrow(|out| out.range(of(context_id)).next().is_some())
}

/// The token of the callout answered now.
pub fn answered(context_id: u32, envoy_id: u64) -> Option<u32> {
    OUT.with_borrow_mut(|out| out.remove(&(context_id, envoy_id)).map(|out| out.token()))
}

/// Request `context_id` is gone: its callouts, which Envoy cancelled; the batches it
/// carried.
pub fn lost(context_id: u32) -> Vec<Callout> {
    OUT.with_borrow_mut(|out| {
        let ours: Vec<(u32, u64)> = out.range(of(context_id)).map(|(key, _)| *key).collect();
        ours.into_iter()
            .filter_map(|key| match out.remove(&key)? {
                Out::Carried(callout) => Some(callout),
                Out::Check(_) => None,
            })
            .collect()
    })
}
