//! Generates the apache.rocketmq.v2 messages and the MessagingService
//! server from `proto/` with protox (pure Rust), so no protoc is needed.

fn main() {
    let root = "proto";
    println!("cargo:rerun-if-changed={root}");
    let protos = [
        "proto/apache/rocketmq/v2/definition.proto",
        "proto/apache/rocketmq/v2/service.proto",
    ];
    let fds = protox::Compiler::new([root])
        .and_then(|mut c| {
            c.include_imports(true).include_source_info(false);
            c.open_files(protos)?;
            Ok(c.encode_file_descriptor_set())
        })
        .unwrap_or_else(|e| panic!("compiling {root}: {e}"));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap_or_else(|_| ".".into()));
    let fds_path = out.join("rocketmq_v2.fds");
    std::fs::write(&fds_path, fds).unwrap_or_else(|e| panic!("writing {}: {e}", fds_path.display()));
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .file_descriptor_set_path(&fds_path)
        // Message bodies as `bytes::Bytes`: a stored body goes out without a
        // copy, a received one is stored from the request buffer.
        .bytes(".apache.rocketmq.v2.Message.body")
        .skip_protoc_run()
        .compile_protos(&protos, &[root])
        .unwrap_or_else(|e| panic!("generating the gRPC service: {e}"));
}
