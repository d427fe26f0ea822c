"""The testbed: real Envoy, the real bridge and Valkey on loopback, for the end-to-end
tests, the demo, the soak and the bench (imported as `testbed.stack`, `testbed.cluster`)."""
