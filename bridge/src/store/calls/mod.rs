//! How a batch of checks becomes script calls and their answers become outcomes: planned
//! per node, each check all-or-nothing (`batch`), merged with every other exchange's calls
//! to that node while its calls are in flight (`commit`), and read back per check, with
//! what must be given back (`tally`). Pure but for `commit`'s lanes, which send through
//! whatever `Caller` the store hands them (`connection::backend`).
//!
//! - `commit`: group commit across every gateway: one lane of calls per node and mode.
//! - `batch`: a batch of checks into script calls per node: own buckets first, shared after.
//! - `tally`: the calls' answers gathered per check, and what must be given back.

pub mod batch;
pub mod commit;
pub mod tally;
