//! A worker's way in from other threads: the answers to its exchanges wait in its mailbox,
//! and a waker, the scheduler of one of its waiting requests, brings the worker to them
//! (its `on_http_filter_scheduled` hook empties the mailbox into the dispatcher). Envoy
//! gives a module's workers no other way to be woken.

use crate::abi::{self, FilterSchedulerPtr};
use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// What comes back for a worker's dispatcher, under its tokens.
pub enum Answer {
    /// A callout's reply: the HTTP status (`None`: reset, timed out, or never sent) and the
    /// body.
    Callout {
        token: u32,
        status: Option<u32>,
        body: Vec<u8>,
    },
    /// A message on stream `stream`.
    Message { stream: u32, bytes: Vec<u8> },
    /// Stream `stream` has ended (gRPC `status`), or never opened.
    Closed { stream: u32, status: u32 },
}

/// A worker's way in from another thread: the scheduler of one of its requests.
struct Waker(FilterSchedulerPtr);

// SAFETY: Envoy makes committing to and deleting a request's scheduler safe from any thread.
unsafe impl Send for Waker {}

/// Where a worker's answers wait for it, and the wakers that bring it to them.
#[derive(Default)]
pub struct Mailbox {
    answers: Mutex<Vec<Answer>>,
    /// Every request of the worker that has waited for a verdict, until it ends, by context
    /// id: as many as the worker has live requests, each left in constant time.
    wakers: Mutex<HashMap<u32, Waker>>,
}

/// The event a waker's commit runs (`on_http_filter_scheduled`).
pub const WAKE: u64 = 0;

impl Mailbox {
    /// Leaves `answer`, and wakes the worker unless answers already wait for it (its turn
    /// takes them all at once).
    pub fn deliver(&self, answer: Answer) {
        let first = {
            let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
            answers.push(answer);
            answers.len() == 1
        };
        if first {
            self.wake();
        }
    }

    /// Every answer that came since the last look.
    pub fn take(&self) -> Vec<Answer> {
        std::mem::take(&mut *self.answers.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// From any thread: has the worker take its turn through one of its wakers; false if it
    /// has none, when no request of it waits. A waker whose request is ending drops the
    /// event, but that request's last turn comes after it left the wakers, and finds what
    /// was delivered before (`leave`).
    pub fn wake(&self) -> bool {
        let wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        match wakers.values().next() {
            Some(waker) => {
                abi::commit_filter(waker.0, WAKE);
                true
            }
            None => false,
        }
    }

    pub fn has_wakers(&self) -> bool {
        !self
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// On the worker: request `context`'s scheduler becomes a waker. Answers that came
    /// while the worker had none (its first waiting request's check may be answered before
    /// its hook returns) are brought now.
    pub fn add_waker(&self, context: u32, scheduler: FilterSchedulerPtr) {
        let old = self
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(context, Waker(scheduler));
        if let Some(old) = old {
            abi::delete_filter_scheduler(old.0);
        }
        let waiting = !self
            .answers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty();
        if waiting {
            self.wake();
        }
    }

    /// On the worker, as request `context` ends: its waker is deleted.
    pub fn leave(&self, context: u32) {
        let waker = self
            .wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&context);
        if let Some(waker) = waker {
            abi::delete_filter_scheduler(waker.0);
        }
    }
}
