//! Finding and compiling the filter once; every `Host` instantiates from the compiled
//! module, so a test file pays for compilation once, not once per test.

use crate::error::HarnessError;
use std::path::{Path, PathBuf};
use wasmtime::{Config, Engine, Module};

/// A compiled module and the engine it belongs to (fuel metering on).
#[derive(Clone)]
pub struct Wasm {
    pub engine: Engine,
    pub module: Module,
    pub path: PathBuf,
}

/// `$RATELIMIT_WASM`, or `<repo>/dist/ratelimit.wasm`.
pub fn default_path() -> PathBuf {
    match std::env::var_os("RATELIMIT_WASM") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("dist")
            .join("ratelimit.wasm"),
    }
}

/// An engine that meters fuel, so each callback's cost can be reported.
pub fn engine() -> Result<Engine, HarnessError> {
    let mut config = Config::new();
    config.consume_fuel(true);
    Engine::new(&config).map_err(|e| HarnessError::Load(format!("{e:#}")))
}

impl Wasm {
    /// Compiles the `.wasm` at `path`; a missing file is an error that says how to build it.
    pub fn load(path: &Path) -> Result<Wasm, HarnessError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(HarnessError::MissingWasm {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(HarnessError::Load(format!("{}: {e}", path.display()))),
        };
        let engine = engine()?;
        let module =
            Module::new(&engine, &bytes).map_err(|e| HarnessError::Load(format!("{e:#}")))?;
        Ok(Wasm {
            engine,
            module,
            path: path.to_path_buf(),
        })
    }

    /// Compiles a module from its bytes (binary, or text when the caller parsed it).
    pub fn from_bytes(bytes: &[u8]) -> Result<Wasm, HarnessError> {
        let engine = engine()?;
        let module =
            Module::new(&engine, bytes).map_err(|e| HarnessError::Load(format!("{e:#}")))?;
        Ok(Wasm {
            engine,
            module,
            path: PathBuf::from("<memory>"),
        })
    }

    /// The filter at `default_path()`.
    pub fn load_default() -> Result<Wasm, HarnessError> {
        Wasm::load(&default_path())
    }
}
