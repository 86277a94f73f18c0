//! The config file and FIRSTSEEN__ environment overrides: any text must be
//! accepted or refused with problems, never panic.
#![no_main]

use firstseen::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // Validation reads the files a config names (secrets, certificates);
    // device and proc files never end, which says nothing about the parser.
    if text.contains("/dev") || text.contains("/proc") || text.contains("/sys") {
        return;
    }
    // The first line, if it looks like one, is an override; the rest the file.
    let (env, file) = match text.split_once('\n') {
        Some((first, rest)) if first.starts_with("FIRSTSEEN__") => match first.split_once('=') {
            Some((k, v)) => (vec![(k.to_string(), v.to_string())], rest),
            None => (Vec::new(), text),
        },
        _ => (Vec::new(), text),
    };
    let _ = Config::parse(file, std::path::Path::new("fuzz.toml"), env);
});
