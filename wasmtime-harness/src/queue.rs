//! Shared queues (`proxy_register_shared_queue` & co) and the notifications they post, as
//! Envoy 1.40 (proxy-wasm-cpp-host's `SharedQueue`) serves them.
//!
//! A queue is named per VM id; registering a name again returns the same token and makes
//! the caller's root context the one notified (last registrant wins). Every enqueue posts
//! one `proxy_on_queue_ready(root, token)` to the registering worker's dispatcher: Envoy
//! runs it after the current event, never inside the callback that enqueued. The harness
//! does the same: posted notifications are delivered when the outermost driving call
//! (request, answer, tick, gRPC message...) has run its callbacks, looping while the
//! notified callbacks post more (`Host::event`, the harness's event loop).

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
