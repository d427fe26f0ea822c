//! The callout transport: `POST /v1/check` (HTTP/1.1 and h2c), one exchange per request,
//! its body bounded in size and in the time it takes to arrive, and charged to the
//! connection's share of the budget before it is read.

use super::guards::budget::{Charge, Share};
use super::probes::{reply, Reply};
use super::wire;
use crate::engine::Engine;
use crate::ops::labels::{Failure, Transport};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Incoming};
use hyper::{Request, StatusCode};
use ratelimit_protocol::MAX_BODY;
use std::time::Duration;

/// One exchange over HTTP, and its share of the budget. A body announced larger than the
/// bound is refused before it is read; one that takes longer than `body_timeout` to arrive
/// is given up (408). The share is taken before the body is read: the size announced, or
/// the bound when none is.
pub async fn check(
    engine: &Engine,
    body_timeout: Duration,
    share: &Share,
    req: Request<Incoming>,
) -> (Reply, Option<Charge>) {
    let announced = req.body().size_hint().lower();
    let metrics = engine.store().metrics();
    if announced > MAX_BODY as u64 {
        metrics.failure(Failure::TooLarge);
        let refused = reply(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a body of {announced} bytes exceeds {MAX_BODY}\n"),
        );
        return (refused, None);
    }
    let expected = req
        .body()
        .size_hint()
        .exact()
        .map_or(MAX_BODY, |n| n as usize);
    let charge = share.charge(expected).await;
    (read_and_answer(engine, body_timeout, req).await, charge)
}

async fn read_and_answer(engine: &Engine, body_timeout: Duration, req: Request<Incoming>) -> Reply {
    let metrics = engine.store().metrics();
    let read = Limited::new(req.into_body(), MAX_BODY).collect();
    let body = match tokio::time::timeout(body_timeout, read).await {
        Ok(Ok(body)) => body.to_bytes(),
        // Past the bound is the client's size; anything else (a reset, a broken chunk)
        // is a bad request, not "too large".
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            metrics.failure(Failure::TooLarge);
            return reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body exceeds {MAX_BODY} bytes\n"),
            );
        }
        Ok(Err(e)) => {
            metrics.failure(Failure::Unreadable);
            return reply(StatusCode::BAD_REQUEST, format!("unreadable body: {e}\n"));
        }
        Err(_) => {
            metrics.failure(Failure::BodyTimeout);
            return reply(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {body_timeout:?}\n"),
            );
        }
    };
    let mut answer = String::new();
    match wire::answer(engine, Transport::Http, &body, &mut answer).await {
        Ok(()) => reply(StatusCode::OK, answer),
        Err(bad) => reply(StatusCode::BAD_REQUEST, format!("{bad}\n")),
    }
}
