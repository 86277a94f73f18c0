//! Throwaway certificates for TLS tests.

use super::*;

/// A throwaway CA and a certificate it signs for the peer name
/// `firstseen-peer`, made with the openssl CLI. Returns (cert, key, ca).
pub fn make_certs(dir: &Path, tag: &str) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ca_key = format!("{tag}-ca.key");
    let ca = format!("{tag}-ca.crt");
    let key = format!("{tag}-node.key");
    let csr = format!("{tag}-node.csr");
    let cert = format!("{tag}-node.crt");
    let ext = format!("{tag}-ext.cnf");
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:firstseen-peer,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &[
            "-keyout",
            &ca_key,
            "-out",
            &ca,
            "-days",
            "2",
            "-subj",
            "/CN=firstseen test CA",
        ],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &["-keyout", &key, "-out", &csr, "-subj", "/CN=firstseen-peer"],
    ]
    .concat());
    run(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &cert,
        "-days",
        "2",
        "-extfile",
        &ext,
    ]);
    (dir.join(cert), dir.join(key), dir.join(ca))
}
