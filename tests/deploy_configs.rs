//! Every example config under deploy/ must pass `firstseen check-config`.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn example_configs_are_valid() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_firstseen"))
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked > 0, "no example config found in {}", dir.display());
}
