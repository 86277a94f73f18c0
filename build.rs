//! Generates the transitdata envelope's encoder from `proto/transitdata.proto`
//! (protoc is already needed by the `pulsar` crate's own build).

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto/transitdata.proto");
    prost_build::compile_protos(&["proto/transitdata.proto"], &["proto/"])
}
