//! What can go wrong driving a guest, worded for a failing test's output: a trap carries
//! the guest's last log lines, since that is where a Rust guest's panic message lands.

use std::fmt;
use std::path::PathBuf;

/// Lines of guest log kept in a trap report.
pub const TRAP_LOG_LINES: usize = 12;

pub enum HarnessError {
    /// The `.wasm` is not there: say how to build it rather than skip.
    MissingWasm { path: PathBuf },
    /// Compiling, linking or instantiating failed.
    Load(String),
    /// The guest trapped (panic, out-of-bounds, unserved host call, fuel exhausted).
    Trap {
        callback: &'static str,
        context_id: u32,
        message: String,
        last_logs: Vec<String>,
    },
    /// The guest called WASI `proc_exit` with this code (a command module ending).
    Exit(i32),
    /// An earlier trap broke the VM; like Envoy, the harness will not call into it again.
    VmFailed(String),
    /// The test asked for something that does not exist (unknown stream, token...).
    Usage(String),
}

impl HarnessError {
    /// Whether this is a trap, and its message (guest log included).
    pub fn trap_text(&self) -> Option<String> {
        match self {
            HarnessError::Trap { .. } => Some(self.to_string()),
            _ => None,
        }
    }
}

impl fmt::Display for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HarnessError::MissingWasm { path } => write!(
                f,
                "{} is missing: run `make build` (or set RATELIMIT_WASM to a built filter)",
                path.display()
            ),
            HarnessError::Load(e) => write!(f, "could not load the module: {e}"),
            HarnessError::Trap {
                callback,
                context_id,
                message,
                last_logs,
            } => {
                writeln!(
                    f,
                    "guest trapped in {callback} (context {context_id}): {message}"
                )?;
                writeln!(f, "last guest log lines:")?;
                for line in last_logs {
                    writeln!(f, "  {line}")?;
                }
                Ok(())
            }
            HarnessError::Exit(code) => write!(f, "guest exited with code {code}"),
            HarnessError::VmFailed(e) => write!(f, "the VM failed earlier and is unusable: {e}"),
            HarnessError::Usage(e) => write!(f, "harness misuse: {e}"),
        }
    }
}

// Debug is what `unwrap` and a test returning `Result` print: make it the readable form.
impl fmt::Debug for HarnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for HarnessError {}
