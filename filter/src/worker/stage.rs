//! Where a request stands as its hooks see it, one definition for every binding: whether
//! its check waits for the whole body (which the host buffers meanwhile), and whether its
//! response body is metered. Each binding keeps one `Stage` beside its request, changed
//! only by these transitions, and maps each `Step` to its host's return codes: the hooks
//! that need no dispatcher (a body chunk, trailers) are answered without one.
//!
//! A request whose check is out needs no stage: both bindings pause its headers so that
//! the host holds its body and trailers back from every filter until its verdict
//! (proxy-wasm's pause, a module's `StopAllIterationAndWatermark`).

use super::dispatch::Go;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stage {
    reading_body: bool,
    metered: bool,
}

/// What a binding does with a request's body chunk or trailers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Let it go on.
    Pass,
    /// Hold it with the request (the host buffers it).
    Hold,
    /// The body its check waits for has ended: hand it to the dispatcher
    /// (`Dispatcher::request_body_end`) and go on as from the request's headers.
    BodyEnded,
}

impl Stage {
    /// The request's headers were seen, and it goes on as `go`.
    pub fn headers_seen(&mut self, go: Option<&Go>) {
        if go == Some(&Go::ReadBody) {
            self.reading_body = true;
        }
    }

    /// A chunk of the request's body (`end`: its last).
    pub fn request_body(&mut self, end: bool) -> Step {
        match (self.reading_body, end) {
            (true, true) => self.body_ended(),
            (true, false) => Step::Hold,
            (false, _) => Step::Pass,
        }
    }

    /// The request's trailers, which end its body.
    pub fn request_trailers(&mut self) -> Step {
        match self.reading_body {
            true => self.body_ended(),
            false => Step::Pass,
        }
    }

    fn body_ended(&mut self) -> Step {
        self.reading_body = false;
        Step::BodyEnded
    }

    /// The response has started (`Dispatcher::response_headers`): its body is metered if
    /// `read_body`; a body not read by now never will be.
    pub fn response_started(&mut self, read_body: bool) {
        self.metered = read_body;
        self.reading_body = false;
    }

    /// A chunk of the response's body (`end`: its last): whether the dispatcher reads it.
    pub fn response_body(&mut self, end: bool) -> bool {
        let metered = self.metered;
        self.metered &= !end;
        metered
    }

    /// The response's trailers: whether they end a metered body (the dispatcher then reads
    /// its end).
    pub fn response_trailers(&mut self) -> bool {
        std::mem::take(&mut self.metered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::admission::Verdict;

    #[test]
    fn a_check_on_the_body_holds_it_until_its_end_once() {
        let mut stage = Stage::default();
        stage.headers_seen(Some(&Go::ReadBody));
        assert_eq!(stage.request_body(false), Step::Hold);
        assert_eq!(stage.request_body(true), Step::BodyEnded);
        // Ended once: what follows is the check's, not the body's.
        assert_eq!(stage.request_trailers(), Step::Pass);
        let mut trailed = Stage::default();
        trailed.headers_seen(Some(&Go::ReadBody));
        assert_eq!(trailed.request_trailers(), Step::BodyEnded);
    }

    #[test]
    fn a_request_not_reading_its_body_passes_it() {
        let gone_on = [
            None,
            Some(Go::Continue),
            Some(Go::Wait),
            Some(Go::Answer(Verdict::Resume)),
        ];
        for go in gone_on {
            let mut stage = Stage::default();
            stage.headers_seen(go.as_ref());
            assert_eq!(stage.request_body(false), Step::Pass);
            assert_eq!(stage.request_trailers(), Step::Pass);
        }
    }

    #[test]
    fn a_metered_response_is_read_to_its_end_by_its_last_chunk_or_its_trailers() {
        let mut stage = Stage::default();
        stage.response_started(true);
        assert!(stage.response_body(false));
        assert!(stage.response_body(true));
        assert!(!stage.response_body(false));
        assert!(!stage.response_trailers());
        stage.response_started(true);
        assert!(stage.response_trailers());
        assert!(!stage.response_trailers());
        let mut plain = Stage::default();
        plain.response_started(false);
        assert!(!plain.response_body(true));
        assert!(!plain.response_trailers());
    }

    #[test]
    fn a_response_ends_the_wait_for_a_body_never_read() {
        let mut stage = Stage::default();
        stage.headers_seen(Some(&Go::ReadBody));
        stage.response_started(false);
        assert_eq!(stage.request_body(true), Step::Pass);
    }
}
