//! Shared queues (`proxy_register_shared_queue` & co) and the notifications they post, as
//! Envoy 1.40 (proxy-wasm-cpp-host's `SharedQueue`) serves them.
//!
//! A queue is named per VM id; registering a name again returns the same token and makes
//! the caller's root context the one notified (last registrant wins). Every enqueue posts
//! one `proxy_on_queue_ready(root, token)` to the registering worker's dispatcher: Envoy
//! runs it after the current event, never inside the callback that enqueued. The harness
//! does the same: posted notifications are delivered when the outermost driving call
//! (request, answer, tick, gRPC message...) has run its callbacks, looping while the
//! notified callbacks post more.

use crate::error::HarnessError;
use crate::host::Host;
use std::collections::VecDeque;

/// Notifications one driving call may deliver before the harness calls it a livelock (a
/// guest that enqueues again in every `proxy_on_queue_ready`, forever).
pub const MAX_POSTED_PER_EVENT: usize = 10_000;

/// One queue the guest registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedQueue {
    /// The VM id it was registered under (the host's `plugin_vm_id` property).
    pub vm_id: String,
    pub name: String,
    pub token: u32,
    /// The root context notified of enqueues: that of the last context to register it.
    pub context_id: u32,
    /// Items enqueued and not yet dequeued, oldest first.
    pub items: VecDeque<Vec<u8>>,
    /// Every successful enqueue so far.
    pub enqueued: usize,
    /// `proxy_on_queue_ready` callbacks delivered for it.
    pub ready_delivered: usize,
}

impl SharedQueue {
    pub fn items_text(&self) -> Vec<String> {
        let text = |m: &Vec<u8>| String::from_utf8_lossy(m).into_owned();
        self.items.iter().map(text).collect()
    }
}

/// Shared-queue state of one VM.
#[derive(Debug, Clone, Default)]
pub struct QueueState {
    pub queues: Vec<SharedQueue>,
    /// Last token handed out; Envoy's start at 1 (0 is illegal).
    pub last_token: u32,
    /// `proxy_on_queue_ready` notifications posted and not yet delivered: (root, token),
    /// the root captured at enqueue time as Envoy's posted closure captures it.
    pub posted: VecDeque<(u32, u32)>,
}

impl QueueState {
    pub fn get_mut(&mut self, token: u32) -> Option<&mut SharedQueue> {
        self.queues.iter_mut().find(|q| q.token == token)
    }

    /// Registers `name` under `vm_id` for root `context_id`; the token, new or existing.
    pub fn register(&mut self, vm_id: &str, name: &str, context_id: u32) -> u32 {
        if let Some(queue) = self
            .queues
            .iter_mut()
            .find(|q| q.vm_id == vm_id && q.name == name)
        {
            queue.context_id = context_id;
            return queue.token;
        }
        let token = self.last_token.wrapping_add(1).max(1);
        self.last_token = token;
        self.queues.push(SharedQueue {
            vm_id: vm_id.to_owned(),
            name: name.to_owned(),
            token,
            context_id,
            items: VecDeque::new(),
            enqueued: 0,
            ready_delivered: 0,
        });
        token
    }

    pub fn resolve(&self, vm_id: &str, name: &str) -> Option<u32> {
        self.queues
            .iter()
            .find(|q| q.vm_id == vm_id && q.name == name)
            .map(|q| q.token)
    }

    /// Pushes `item` and posts the notification; `false` for an unknown token.
    pub fn enqueue(&mut self, token: u32, item: Vec<u8>) -> bool {
        let Some(queue) = self.get_mut(token) else {
            return false;
        };
        queue.items.push_back(item);
        queue.enqueued += 1;
        let context_id = queue.context_id;
        self.posted.push_back((context_id, token));
        true
    }
}

impl Host {
    pub fn shared_queues(&self) -> &[SharedQueue] {
        &self.state().queues.queues
    }

    /// The queue registered as `name` (under any VM id).
    pub fn shared_queue(&self, name: &str) -> Option<&SharedQueue> {
        self.shared_queues().iter().find(|q| q.name == name)
    }

    /// `proxy_on_queue_ready` notifications posted and not yet delivered.
    pub fn posted_notifications(&self) -> usize {
        self.state().queues.posted.len()
    }

    /// Delivers every posted `proxy_on_queue_ready`, oldest first, including those the
    /// notified callbacks post. A failed VM gets none (Envoy finds no live context).
    pub(crate) fn deliver_posted(&mut self) -> Result<(), HarnessError> {
        let mut delivered = 0;
        loop {
            if self.vm_failed() {
                self.state_mut().queues.posted.clear();
                return Ok(());
            }
            if delivered == MAX_POSTED_PER_EVENT && !self.state().queues.posted.is_empty() {
                return Err(HarnessError::Usage(format!(
                    "{MAX_POSTED_PER_EVENT} proxy_on_queue_ready in one event: the guest \
                     enqueues again in every one"
                )));
            }
            let Some((root, token)) = self.state_mut().queues.posted.pop_front() else {
                return Ok(());
            };
            delivered += 1;
            let params = (root as i32, token as i32);
            let ran = self.call_guest::<(i32, i32), ()>("proxy_on_queue_ready", root, params)?;
            if ran.is_some() {
                if let Some(queue) = self.state_mut().queues.get_mut(token) {
                    queue.ready_delivered += 1;
                }
            }
        }
    }
}
