#[cfg(feature = "build-server")]
fn should_build_server() -> bool {
    true
}

#[cfg(not(feature = "build-server"))]
fn should_build_server() -> bool {
    false
}

fn main() {
    let proto_root = "proto";
    println!("cargo:rerun-if-changed={proto_root}");

    let protos = [
        "proto/etcd/api/authpb/auth.proto",
        "proto/etcd/api/etcdserverpb/rpc.proto",
        "proto/etcd/api/mvccpb/kv.proto",
        "proto/etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
        "proto/etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
    ];
    // ROKKA PATCH: the descriptors come from protox (pure Rust), not from a
    // protoc binary on the machine; prost-build then skips its protoc run.
    let fds = protox::Compiler::new([proto_root])
        .expect("protox include path")
        .include_imports(true)
        .include_source_info(true)
        .open_files(protos)
        .expect("Failed to parse proto files")
        .encode_file_descriptor_set();
    let fds_path = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("etcd.fds");
    std::fs::write(&fds_path, fds).expect("write the descriptor set");
    tonic_prost_build::configure()
        .build_server(should_build_server())
        .file_descriptor_set_path(&fds_path)
        .skip_protoc_run()
        .compile_protos(&protos, &[proto_root])
        .expect("Failed to compile proto files");
}
