"""The frameworks' own wordings, one per line, land in the right category end to end.

Each rule's examples test that rule alone; this table tests which finding wins for a message a user
pastes on its own, across the pack (a generic rule outranking the family that knows the words, as
KRN016 once did for CUDA_ERROR_OUT_OF_MEMORY). The messages are the programs' templates as PyTorch,
TensorFlow, JAX, NCCL, CUDA and the data loaders print them, with made-up numbers and paths.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from gpufix.diagnosis import STDIN, diagnose_inputs
from gpufix.rules.corpus import predict_text
from gpufix.rules.loader import load_ruleset

WORDINGS: list[tuple[str, str]] = [
    ('oom', 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 3.06 MiB is free.'),
    ('oom', 'RuntimeError: CUDA error: out of memory'),
    ('oom', 'tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[32,64,224,224] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc'),
    ('oom', 'jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.'),
    ('oom', 'RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED'),
    ('oom', 'RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`'),
    ('oom', '2023-01-01 10:00:00.000000: W tensorflow/core/common_runtime/bfc_allocator.cc:479] Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.17GiB (rounded to 1258291200)requested by op Conv2D'),
    ('oom', 'torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 14.75 GiB total capacity; 12.20 GiB already allocated; 1.03 GiB free; 12.45 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.'),
    ('oom', "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:121, unhandled cuda error, NCCL version 2.14.3 ncclUnhandledCudaError: Call to CUDA function failed. Last error: Cuda failure 'out of memory'"),
    ('oom', 'CUDA_ERROR_OUT_OF_MEMORY: out of memory'),
    ('cpu_fallback', 'UserWarning: CUDA initialization: CUDA driver initialization failed, you might not have a CUDA gpu.'),
    ('cpu_fallback', "ValueError: Invalid CUDA '--device 0' requested, use '--device cpu' or pass valid CUDA device(s)"),
    ('cpu_fallback', 'tensorflow.python.framework.errors_impl.InternalError: cudaGetDevice() failed. Status: cudaGetErrorString symbol not found.'),
    ('cpu_fallback', 'RuntimeError: cuDNN version incompatibility: PyTorch was compiled  against (8, 9, 2) but found runtime version (8, 5, 0). PyTorch already comes bundled with cuDNN. One option to resolving this error is to ensure PyTorch can find the bundled cuDNN.'),
    ('cpu_fallback', 'Could not load library libcudnn_cnn_infer.so.8. Error: libcuda.so: cannot open shared object file: No such file or directory'),
    ('cpu_fallback', "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'"),
    ('cpu_fallback', 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'),
    ('cpu_fallback', 'RuntimeError: Attempting to deserialize object on CUDA device 0 but torch.cuda.device_count() is 0. Please use torch.load with map_location to map your storages to an existing device.'),
    ('cpu_fallback', 'AssertionError: Found no NVIDIA driver on your system.'),
    ('other', 'RuntimeError: The detected CUDA version (12.1) mismatches the version that was used to compile PyTorch (11.8). Please make sure to use the same CUDA versions.'),
    ('cpu_fallback', 'RuntimeError: No CUDA GPUs are available'),
    ('cpu_fallback', 'W0512 10:00:00.000000 140 xla_bridge.py:636] CUDA backend failed to initialize: Found cuDNN version 8600, but JAX was built against version 8800, which is newer. The copy of cuDNN that is installed must be at least as new as the version against which JAX was built. (Set TF_CPP_MIN_LOG_LEVEL=0 and rerun for more info.)'),
    ('cpu_fallback', '2023-01-01 10:00:00.000000: E tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:417] Loaded runtime CuDNN library: 8.1.0 but source was compiled with: 8.6.0.  CuDNN library needs to have matching major version and equal or higher minor version.'),
    ('cpu_fallback', 'torch.cuda.is_available() returned False'),
    ('cpu_fallback', 'UserWarning: torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.'),
    ('arch_mismatch', 'RuntimeError: CUDA error: no kernel image is available for execution on the device'),
    ('arch_mismatch', 'NVIDIA GeForce RTX 5090 with CUDA capability sm_120 is not compatible with the current PyTorch installation. The current PyTorch install supports CUDA capabilities sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90.'),
    ('arch_mismatch', 'RuntimeError: CUDA error: invalid device function'),
    ('arch_mismatch', 'cudaErrorNoKernelImageForDevice'),
    ('arch_mismatch', 'RuntimeError: CUDA error: the provided PTX was compiled with an unsupported toolchain.'),
    ('arch_mismatch', 'Found GPU0 GeForce GT 730 which is of cuda capability 3.5. PyTorch no longer supports this GPU because it is too old. The minimum cuda capability supported by this library is 3.7.'),
    ('arch_mismatch', 'RuntimeError: FlashAttention only supports Ampere GPUs or newer.'),
    ('arch_mismatch', "ptxas fatal   : Value 'sm_89' is not defined for option 'gpu-name'"),
    ('arch_mismatch', "nvcc fatal   : Unsupported gpu architecture 'compute_89'"),
    ('arch_mismatch', 'RuntimeError: CUDA error: CUBLAS_STATUS_ARCH_MISMATCH when calling `cublasGemmEx(...)`'),
    ('arch_mismatch', "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: ptxas exited with non-zero error code 65280, output: ptxas fatal   : Value 'sm_90a' is not defined for option 'gpu-name'"),
    ('arch_mismatch', 'tensorflow/core/common_runtime/gpu/gpu_device.cc:1934] Ignoring visible gpu device (device: 0, name: Tesla K40c, pci bus id: 0000:03:00.0, compute capability: 3.5) with Cuda compute capability 3.5. The minimum required Cuda capability is 6.0.'),
    ('arch_mismatch', 'Triton Error [CUDA]: device kernel image is invalid'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: an illegal memory access was encountered'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: device-side assert triggered'),
    ('illegal_memory_access', '../aten/src/ATen/native/cuda/Loss.cu:240: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: misaligned address'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: an illegal instruction was encountered'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`'),
    ('illegal_memory_access', 'RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: CUBLAS_STATUS_INVALID_VALUE when calling `cublasGemmStridedBatchedExFix( handle, opa, opb, m, n, k, (void*)(&falpha), a, CUDA_R_16F, lda, stridea, b, CUDA_R_16F, ldb, strideb, (void*)(&fbeta), c, CUDA_R_16F, ldc, stridec, num_batches, CUDA_R_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`'),
    ('illegal_memory_access', 'Error: an illegal memory access was encountered'),
    ('illegal_memory_access', 'CUDA error 700 [/src/kernel.cu, 88]: an illegal memory access was encountered'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: too many resources requested for launch'),
    ('illegal_memory_access', 'RuntimeError: CUDA error: the launch timed out and was terminated'),
    ('illegal_memory_access', '/pytorch/aten/src/THC/THCTensorIndex.cu:361: void indexSelectLargeIndex(...): block: [95,0,0], thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.'),
    ('other', 'RuntimeError: CUDA error: operation not permitted when stream is capturing'),
    ('illegal_memory_access', 'jaxlib.xla_extension.XlaRuntimeError: INTERNAL: CUDA error: : CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered'),
    ('device_mismatch', 'RuntimeError: Tensors must be CUDA and dense'),
    ('device_mismatch', 'RuntimeError: No backend type associated with device type cpu'),
    ('device_mismatch', 'RuntimeError: Input, output and indices must be on the current device'),
    ('device_mismatch', 'RuntimeError: expected device cuda:0 but got device cpu'),
    ('device_mismatch', "RuntimeError: Expected object of backend CUDA but got backend CPU for argument #2 'mat2'"),
    ('device_mismatch', 'RuntimeError: arguments are located on different GPUs at /pytorch/aten/src/THC/generic/THCTensorMathPairwise.cu:21'),
    ('device_mismatch', "TypeError: can't convert CUDA tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."),
    ('device_mismatch', 'ValueError: Received incompatible devices for jitted computation. Got argument x of f with shape float32[8] and device ids [0] on platform GPU and argument y of f with shape float32[8] and device ids [1] on platform GPU'),
    ('device_mismatch', 'RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! (when checking argument for argument index in method wrapper__index_select)'),
    ('device_mismatch', "RuntimeError: Expected tensor for argument #1 'indices' to have the same device as tensor for argument #2 'weight'; but device 0 does not equal 1 (while checking arguments for embedding)"),
    ('device_mismatch', 'RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!'),
    ('device_mismatch', 'RuntimeError: Expected all tensors to be on the same device, but got index is on cpu, different from other tensors on cuda:0 (when checking argument in method wrapper_CUDA__index_select)'),
    ('device_mismatch', 'RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same or input should be a MKLDNN tensor and weight is a dense tensor'),
    ('device_mismatch', 'RuntimeError: Expected tensor to have CUDA Backend, but got tensor with CPU Backend (while checking arguments for cudnn_convolution)'),
    ('device_mismatch', 'RuntimeError: Expected all tensors to be on the same device, but found at least two devices, meta and cuda:0!'),
    ('hardware_xid', 'NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.'),
    ('hardware_xid', 'RuntimeError: CUDA error: uncorrectable ECC error encountered'),
    ('hardware_xid', 'Unable to determine the device handle for GPU 0000:3B:00.0: Unknown Error'),
    ('hardware_xid', 'NVRM: GPU at PCI:0000:1a:00: GPU-1234 has fallen off the bus.'),
    ('hardware_xid', 'NVRM: Xid (PCI:0000:18:00): 48, pid=2211, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, subpartition 0.'),
    ('device_mismatch', 'RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'),
    ('device_mismatch', 'RuntimeError: Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same'),
    ('device_mismatch', "RuntimeError: Expected object of device type cuda but got device type cpu for argument #1 'self' in call to _th_mm"),
    ('device_mismatch', "RuntimeError: Expected tensor for argument #1 'input' to have the same device as tensor for argument #2 'weight'; but device 1 does not equal 0 (while checking arguments for cudnn_convolution)"),
    ('device_mismatch', "RuntimeError: Tensor for 'out' is on CPU, Tensor for argument #1 'self' is on CPU, but expected them to be on GPU (while checking arguments for addmm)"),
    ('device_mismatch', 'RuntimeError: indices should be either on cpu or on the same device as the indexed tensor (cpu)'),
    ('device_mismatch', "TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."),
    ('device_mismatch', "RuntimeError: Expected a 'cuda' device type for generator but found 'cpu'"),
    ('device_mismatch', 'RuntimeError: Input and hidden tensors are not at the same device, found input tensor at cuda:0 and hidden tensor at cpu'),
    ('device_mismatch', 'RuntimeError: Expected all tensors to be on the same device, but got mat2 is on cuda:1, different from other tensors on cuda:0 (when checking argument in method wrapper_CUDA_mm)'),
    ('nccl_hang', 'RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8'),
    ('nccl_hang', 'torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3'),
    ('nccl_hang', 'ncclInternalError: Internal check failed.'),
    ('nccl_hang', 'node-1:3312:3390 [0] NCCL WARN Connect to 10.0.0.2<43210> failed : Connection refused'),
    ('nccl_hang', 'node-1:3312:3390 [0] NCCL WARN Net : Connection closed by remote peer 10.0.0.3<51234>'),
    ('nccl_hang', 'node-1:3312:3390 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.3<53152> with error 12, opcode 32543, len 0, vendor err 129'),
    ('nccl_hang', 'node-1:3312:3390 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.1.1.1<44231> failed : Software caused connection abort'),
    ('nccl_hang', "RuntimeError: [1] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Connection reset by peer"),
    ('nccl_hang', 'torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError'),
    ('nccl_hang', 'RuntimeError: Timed out initializing process group in store based barrier on rank: 3, for key: store_based_barrier_key:1 (world_size=4, worker_count=2, timeout=0:30:00)'),
    ('nccl_hang', 'RuntimeError: The server socket has failed to listen on any local network address. The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use). The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).'),
    ('nccl_hang', '[W socket.cpp:601] [c10d] The client socket has failed to connect to [node-0]:29500 (errno: 110 - Connection timed out).'),
    ('nccl_hang', 'node-1:3312:3390 [0] NCCL WARN Call to ibv_reg_mr failed'),
    ('nccl_hang', 'RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint(OpType=ALLREDUCE, TensorShape=[12], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cuda, layout=Strided (default), requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 1 is running collective: CollectiveFingerPrint(OpType=BROADCAST).'),
    ('nccl_hang', "[rank0]:[E ProcessGroupNCCL.cpp:1182] [PG 0 Rank 0] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in monitoring enqueued collectives. This typically indicates a NCCL/CUDA API hang blocking the watchdog, and could be triggered by another thread holding the GIL inside a CUDA api, or other deadlock-prone behaviors."),
    ('nccl_hang', 'RuntimeError: Rank 1 successfully reached monitoredBarrier, but received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.'),
    ('nccl_hang', 'RuntimeError: Socket Timeout'),
    ('nccl_hang', 'torch.distributed.DistNetworkError: Connection reset by peer'),
    ('nccl_hang', 'RuntimeError: NCCL communicator was aborted on rank 1.'),
    ('nccl_hang', 'horovod.common.exceptions.HorovodInternalError: Horovod has been shut down. This was caused by an exception on one of the ranks or an attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished execution. If the shutdown was caused by an exception, you should see the exception in the log before the first shutdown message.'),
    ('nccl_hang', 'jaxlib.xla_extension.XlaRuntimeError: INTERNAL: external/xla/xla/service/gpu/nccl_utils.cc:297: NCCL operation ncclCommInitRank(&comm, nranks, *nccl_id, rank) failed: unhandled cuda error'),
    ('nccl_hang', 'tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: Socket closed'),
    ('nccl_hang', 'node-2:1244:1301 [3] NCCL WARN Error : ring 0 does not loop back to start (1 != 0)'),
    ('nccl_hang', "torch.distributed.DistBackendError: [2] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout"),
    ('nccl_hang', 'RuntimeError: Stop_waiting response is expected'),
    ('nccl_hang', 'NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 3d000'),
    ('nccl_hang', 'torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.'),
    ('nccl_hang', '[E socket.cpp:922] [c10d] The client socket has timed out after 900s while trying to connect to (10.0.0.1, 29500).'),
    ('nccl_hang', "RuntimeError: Distributed package doesn't have NCCL built in"),
    ('nccl_hang', 'RuntimeError: NCCL Error 2: unhandled system error'),
    ('slow_loader', 'RuntimeError: DataLoader worker (pid(s) 8823, 8824) exited unexpectedly'),
    ('slow_loader', 'RuntimeError: DataLoader worker (pid 8823) is killed by signal: Killed.'),
    ('slow_loader', 'RuntimeError: DataLoader worker (pid 4412) exited unexpectedly with exit code 1. Details are lost due to multiprocessing. Rerunning with num_workers=0 may give better error trace.'),
    ('slow_loader', 'RuntimeError: DataLoader timed out after 120 seconds'),
    ('slow_loader', "RuntimeError: Too many open files. Communication with the workers is no longer possible. Please increase the limit using `ulimit -n` in the shell or change the sharing strategy by calling `torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of your code"),
    ('slow_loader', 'RuntimeError: unable to open shared memory object </torch_2231_2417538361_0> in read-write mode: Too many open files (24)'),
    ('slow_loader', 'RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on device (28)'),
    ('slow_loader', 'ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).'),
    ('slow_loader', 'ERROR: Unexpected segmentation fault encountered in worker.'),
    ('slow_loader', 'RuntimeError: received 0 items of ancdata'),
    ('slow_loader', 'RuntimeError: Pin memory thread exited unexpectedly'),
    ('slow_loader', 'RuntimeError: unable to mmap 1024 bytes from file </torch_1123_3512_0>: Cannot allocate memory (12)'),
    ('slow_loader', 'RuntimeError: Shared memory manager connection has timed out'),
    ('slow_loader', 'OSError: [Errno 24] Too many open files'),
    ('slow_loader', "RuntimeError: DataLoader worker (pid 311) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit."),
    ('slow_loader', 'RuntimeError: DataLoader worker (pid 5520) is killed by signal: Segmentation fault.'),
    ('slow_loader', 'RuntimeError: DataLoader worker (pid(s) 1234) exited unexpectedly'),
    ('nan_loss', 'NaN or Inf found in input tensor.'),
    ('nan_loss', 'tensorflow.python.framework.errors_impl.InvalidArgumentError: Nan in summary histogram for: conv1/weights_0'),
    ('nan_loss', 'epoch 3 | iter 1200 | ppl: nan | lr 0.0003'),
    ('nan_loss', 'Epoch 12: kl: nan, recon: 0.4412, total: nan'),
    ('nan_loss', 'NaN detected in loss at step 5120'),
    ('nan_loss', 'Encountered NaN loss at step 300, skipping'),
    ('nan_loss', '| epoch 004:   1200 / 5000 loss=nan, nll_loss=nan, ppl=nan, wps=12330, ups=3, wpb=4096, bsz=128, num_updates=16200, lr=0.0005, gnorm=nan, clip=100, train_wall=512'),
    ('nan_loss', 'Epoch [5/100], Step [200/600], Loss: nan'),
    ('nan_loss', '2023-05-01 10:00:00 | INFO | train | epoch 001 | loss nan | ppl nan | wps 4521'),
    ('nan_loss', 'Train Epoch: 3 [12800/60000 (21%)]\tLoss: nan'),
    ('nan_loss', 'iter 1500: loss nan, time 112.33ms, mfu 38.21%'),
    ('nan_loss', 'step 400 | loss: nan | lr: 6.0e-04'),
    ('nan_loss', '[Epoch 7/200] [Batch 55/938] [D loss: nan] [G loss: nan]'),
    ('nan_loss', 'Epoch 3/10  d_loss: nan  g_loss: nan'),
    ('nan_loss', "WARNING: non-finite loss, ending training  tensor([nan, nan, nan, nan], device='cuda:0')"),
    ('nan_loss', 'FloatingPointError: Minimum loss scale reached (0.0001). Your loss is probably exploding. Try lowering the learning rate, using gradient clipping or increasing the batch size.'),
    ('nan_loss', 'Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.'),
    ('nan_loss', 'the loss becomes nan after 3 epochs'),
    ('nan_loss', 'Validation: acc=0.1000 loss=nan'),
    ('nan_loss', ' Epoch   gpu_mem       box       obj       cls     total    labels  img_size\\n     5/299     3.21G       nan       nan       nan       nan        40       640'),
    ('nan_loss', 'Loss: inf'),
    ('nan_loss', 'avg_loss = nan'),
    ('nan_loss', "RuntimeError: Function 'MulBackward0' returned nan values in its 0th output."),
    ('other', 'Your input ran out of data; interrupting training. Make sure that your dataset or generator can generate at least `steps_per_epoch * epochs` batches (in this case, 5000 batches). You may need to use the repeat() function when building your dataset.'),
    ('other', "AttributeError: Can't pickle local object 'get_transform.<locals>.<lambda>'"),
    ('other', "TypeError: default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found <class 'PIL.Image.Image'>"),
    ('other', 'RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and [3, 224, 300] at entry 3'),
    ('other', 'FileNotFoundError: Caught FileNotFoundError in DataLoader worker process 0.'),
    ('other', 'RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error indicates that your module has parameters that were not used in producing loss.'),
    ('other', 'Starting training: best_val_loss = inf'),
    ('other', 'RuntimeError: Input type (torch.cuda.HalfTensor) and weight type (torch.cuda.FloatTensor) should be the same'),
    ('other', 'RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough memory: you tried to allocate 34359738368 bytes.'),
    # added 2026-12-02 (eighth session), from rep22-25's development parts and wording inventories
    ('cpu_fallback', 'RuntimeError: cuda runtime error (3) : initialization error at /opt/conda/conda-bld/pytorch_1544174967633/work/aten/src/THC/THCGeneral.cpp:51'),
    ('other', "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the 'spawn' start method"),
    ('cpu_fallback', 'RuntimeError: torch.cuda.FloatTensor is not enabled.'),
    ('cpu_fallback', "AttributeError: module 'torch._C' has no attribute '_cuda_getDevice'"),
    ('cpu_fallback', 'Internal error. Requested ReadyEvent with GPU device but not compiled with CUDA.'),
    ('cpu_fallback', 'XGBoost version not compiled with GPU support'),
    ('cpu_fallback', 'RuntimeError: jaxlib/cuda/versions_helpers.cc:81: operation cusparseGetProperty(MAJOR_VERSION, &major) failed: The cuSPARSE library was not found.'),
    ('cpu_fallback', 'RuntimeError: Unknown backend gpu'),
    ('cpu_fallback', "RuntimeError: You requested to find 1 devices but only 0 are currently available. The devices [0] are occupied by other processes and can't be used at the moment."),
    ('cpu_fallback', 'Exception: CUDA SETUP: Setup Failed!'),
    ('cpu_fallback', 'RuntimeError: nms_impl: implementation for device cuda:0 not found.'),
    ('cpu_fallback', '2023-06-12 10:07:52.319207: W tensorflow/core/framework/op_kernel.cc:1830] OP_REQUIRES failed at xla_ops.cc:362 : INTERNAL: libdevice not found at ./libdevice.10.bc'),
    ('arch_mismatch', "'sm_89' is not a recognized processor for this target (ignoring processor)"),
    ('arch_mismatch', 'XlaRuntimeError: UNIMPLEMENTED: ptxas too old. Falling back to the driver to compile.'),
    ('arch_mismatch', "node1:2211:2290 [0] enqueue.cc:197 NCCL WARN Cuda failure 'invalid device function'"),
    ('arch_mismatch', 'RuntimeError: cuda runtime error (209)'),
    ('arch_mismatch', 'AssertionError: Device compute capability 8.9 or higher required for FP8 execution.'),
    ('arch_mismatch', "nvcc fatal   : Value 'sm_90a' is not defined for option 'gpu-architecture'"),
    ('oom', 'F0302 12:30:05.123456  4242 syncedmem.cpp:56] Check failed: error == cudaSuccess (2 vs. 0)  out of memory'),
    ('oom', 'RuntimeError: cuDNN error: CUDNN_STATUS_NOT_INITIALIZED'),
    ('oom', "  what():  std::bad_alloc: CNMEM error at: /opt/rapids/include/rmm/mr/device/cnmem_memory_resource.hpp168: CNMEM_STATUS_OUT_OF_MEMORY"),
    ('oom', 'Error out of memory at line 380 in file /home/ml/bitsandbytes/csrc/pythonInterface.c'),
    ('oom', 'RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling cublasCreate(handle)'),
    ('illegal_memory_access', '(TCatBoostException) catboost/cuda/cuda_lib/cuda_base.h:261: CUDA error 9: invalid configuration argument'),
    ('nccl_hang', "external/xla/xla/service/gpu/nccl_utils.cc:133: NCCL operation ncclGetUniqueId(&id) failed: Unable to load NCCL library. Multi-GPU collectives will not work.;"),
    ('nccl_hang', 'Device /job:localhost/replica:0/task:0/device:GPU:1 is joining a group with size 2, but that group has size 3 (group_key=1)'),
    ('nccl_hang', 'InternalError: NCCL: unhandled system error. Set NCCL_DEBUG=WARN for detail.'),
    ('nan_loss', "[W 2021-09-14 09:47:12,518] Trial 3 failed because of the following error: ValueError('The parameter loc has invalid values')"),
    ('nan_loss', 'Training: 2023-05-19 14:37:11,482-Speed 958.14 samples/sec   Loss 9.6127   Epoch: 5   Global Step: 452310   Fp16 Grad Scale:  0   Required: 179 hours'),
    ('nan_loss', 'jax._src.checkify.JaxRuntimeError: nan generated by primitive: log.'),
    ('device_mismatch', 'RuntimeError: Expected scalars to be on CPU, got cuda:0 instead'),
    ('device_mismatch', 'RuntimeError: All tensors must be on devices[0]: 0'),
    ('state_dict_prefix', "Some weights of the model checkpoint at ./ckpt were not used when initializing BertModel: ['module.bert.embeddings.word_embeddings.weight', 'module.bert.encoder.layer.0.attention.self.query.weight']"),
    ('other', '2019-11-04 13:52:47.201583: E tensorflow/stream_executor/cuda/cuda_driver.cc:890] failed to alloc 34357641216 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory'),
    ('other', 'W tensorflow/core/common_runtime/base_collective_executor.cc:217] BaseCollectiveExecutor::StartAbort Out of range: End of sequence'),
    ('other', "Exception ignored in: <_io.TextIOWrapper name='<stdout>' mode='w' encoding='utf-8'>\\nBrokenPipeError: [Errno 32] Broken pipe"),
    ('cpu_fallback', 'Hardware accelerator e.g. GPU is available in the environment, but no `device` argument is passed to the `Pipeline` object. Model will be on CPU.'),
    ('cpu_fallback', 'RuntimeError: Found 0 GPUs on your machine (GPU devices found: [])! If your machine does not have any GPUs, you should set the config keys `num_gpus` and `num_gpus_per_worker` to 0.'),
    ('cpu_fallback', "AttributeError: 'NoneType' object has no attribute 'cadam32bit_grad_fp32'"),
    ('state_dict_prefix', "There were missing keys in the checkpoint model loaded: ['roberta.embeddings.word_embeddings.weight', 'classifier.out_proj.weight'].\\nThere were unexpected keys in the checkpoint model loaded: ['module.roberta.embeddings.word_embeddings.weight', 'module.classifier.out_proj.weight']."),
    ('state_dict_prefix', 'RuntimeError: Missing key in checkpoint state_dict: model._orig_mod.tok_embeddings.weight.'),
    ('slow_loader', 'RuntimeError: One of the subprocesses has abruptly died during map operation.To debug the error, disable multiprocessing.'),
    ('nccl_hang', 'gpu-node-03:40112:40309 [5] transport/net_ib.cc:1423 NCCL WARN NET/IB : req 0/1 tag 7 peer 10.10.1.14<53812> collective mismatch error, local size 1048576 remote size 524288'),
    ('nan_loss', 'epoch,accuracy,loss,val_accuracy,val_loss\\n0,0.8312,0.5123,0.8901,0.3312\\n1,0.1012,nan,0.0980,nan'),
    ('nan_loss', ' validation loss at iteration 1000 | lm loss value: NAN | lm loss PPL: 4.851652E+08 | '),
    ('arch_mismatch', "ptxas /tmp/tmpq1w_3u8z.ptx, line 217; error   : Feature 'cvt.bf16.f32' requires .target sm_80 or higher"),
    ('arch_mismatch', 'RuntimeError: Current CUDA Device does not support bfloat16. Please switch dtype to float16.'),
    ('hardware_xid', "Detected 12 CRC FLIT NvLink errors on GPU 3's NVLink which exceeds threshold of 100"),
    ('oom', 'Got an OOM, unloading all loaded models.'),
    ('nan_loss', 'RuntimeError: grad_scale is too small, exiting: 5.820766091346741e-11'),
    ('cpu_fallback', 'AssertionError: CPU training is not allowed.'),
    ('arch_mismatch', "ValueError: Your setup doesn't support bf16/gpu. You need torch>=1.10, using Ampere GPU with cuda>=11.0"),
    ('other', 'AMP: checks failed ❌. Anomalies were detected with AMP on your system that may lead to NaN losses or zero-mAP results, so AMP will be disabled during training.'),
    ('cpu_fallback', "WARNING: /workspace/src/context.cc:196: Device is changed from GPU to CPU as we couldn't find any available GPU on the system."),
    ('cpu_fallback', "AttributeError: module 'faiss' has no attribute 'StandardGpuResources'"),
    ('cpu_fallback', 'F0612 10:21:32.002941  2231 common.cpp:66] Cannot use GPU in CPU-only Caffe: check mode.'),
    ('cpu_fallback', 'OSError: Unknown compute capability. Ensure PyTorch with CUDA support is installed.'),
    ('oom', '_catboost.CatBoostError: catboost/cuda/cuda_lib/cuda_base.h:281: CUDA error 2: out of memory'),
    ('nan_loss', 'RuntimeError: NaN is detected on forward computation of SoftmaxCrossEntropy'),
    ('device_mismatch', 'ValueError: Array device must be same as the current device: array device = 1 while current = 0'),
    ('nccl_hang', 'lightgbm.basic.LightGBMError: Socket recv error, Connection reset by peer (code: 104)'),
    ('arch_mismatch', 'OSError: Could not find compatible tinycudann extension for compute capability 90.'),
    ('hardware_xid', 'GPU 6 had memory errors and row remappings are pending'),
    ('other', "INFO:faiss.loader:Failed to load GPU Faiss: name 'GpuIndexIVFFlat' is not defined. Will not load constructor refs for GPU indexes. This is only an error if you're trying to use GPU Faiss."),
]


@pytest.fixture(scope="module")
def pack():  # type: ignore[no-untyped-def]
    return load_ruleset(word_model=False)  # the rules' own coverage: the inventories are the word model's training data


@pytest.mark.parametrize(("category", "text"), WORDINGS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(WORDINGS)])
def test_a_framework_wording_alone_gets_its_category(pack, category: str, text: str) -> None:  # type: ignore[no-untyped-def]
    got, code = predict_text(text.replace("\\n", "\n") + "\n", pack)
    assert got == category, (code, text)


def test_an_unknown_cuda_error_yields_to_another_categorys_family(pack) -> None:  # type: ignore[no-untyped-def]
    # KRN016 reads any CUDA error no rule knows as a kernel fault; when the same log says in a family's words that the
    # driver could not even be loaded, that family names the root cause and the unknown error is its consequence
    text = ("RuntimeError: Unable to initialize the CUDA driver: could not load libcuda\n"
            "cupy_backends.cuda.api.driver.CUDADriverError: CUDA_ERROR_NOT_FOUND: named symbol not found\n")
    findings = diagnose_inputs([STDIN], pack, stdin=io.BytesIO(text.encode())).findings
    root = [f for f in findings if f.consequence_of is None]
    assert [f.code for f in root] == ["ENV900"], [(f.code, f.consequence_of) for f in findings]
    assert any(f.code == "KRN016" and f.consequence_of == "ENV900" for f in findings)


def test_a_swapped_wrapper_prefix_is_worded_as_one(pack) -> None:  # type: ignore[no-untyped-def]
    # one wrapper's name saved where another's is expected (a DQN's target net loaded into its online net): no
    # single side has "the extra prefix", so the message must not say "the both names every key..."
    keys = ["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight"]
    text = ("RuntimeError: Error(s) in loading state_dict for Net:\n"
            "\tMissing key(s) in state_dict: " + ", ".join(f'"online_net.{k}"' for k in keys) + ".\n"
            "\tUnexpected key(s) in state_dict: " + ", ".join(f'"target_net.{k}"' for k in keys) + ".\n")
    findings = diagnose_inputs([STDIN], pack, stdin=io.BytesIO(text.encode())).findings
    [ckp] = [f for f in findings if f.code == "CKP010"]
    assert "different wrapper prefixes: target_net. (the model has online_net.)" in ckp.message, ckp.message
    assert "the both" not in ckp.message
    # the same with DataParallel's "module." saved where a Lightning module's "model." is expected: not "a checkpoint
    # from DDP that the model expects without a prefix" (CKP001), the model has a prefix of its own
    swapped = text.replace("online_net.", "model.").replace("target_net.", "module.")
    findings = diagnose_inputs([STDIN], pack, stdin=io.BytesIO(swapped.encode())).findings
    [root] = [f for f in findings if f.consequence_of is None]
    assert root.code == "CKP010" and "module. (the model has model.)" in root.message, root.message


def test_memory_advice_follows_the_program_that_ran_out(pack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """GPU PhysX (Isaac Gym / Isaac Lab) allocates the simulator's buffers for all environments: the advice is
    fewer environments, not a network's batch size or mixed precision, which stays the advice elsewhere."""
    def titles(text: str) -> list[str]:
        log = tmp_path / "pasted.txt"
        log.write_text(text + "\n", encoding="utf-8")
        root = diagnose_inputs([str(log)], pack).findings[0]
        assert root.category == "oom", root.code
        return [fix.title for fix in root.fixes]

    physx = titles("[Error] [carb.gym.plugin] PxgCudaDeviceMemoryAllocator fail to allocate memory 339738624 bytes!! Result = 2")
    assert any("fewer environments" in t for t in physx)
    assert not any("batch size" in t or "mixed precision" in t for t in physx)
    other = titles("RESOURCE_EXHAUSTED: out of memory while trying to allocate 1.2GiB on the GPU")
    assert any("batch size" in t for t in other) and not any("fewer environments" in t for t in other)


def test_cpu_fallback_advice_checks_the_framework_the_log_names(pack, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A TensorFlow log that registered no GPU is told to ask TensorFlow and install its CUDA build, not torch; a log
    that names torch, or no framework at all, keeps torch's check (the commonest case)."""
    from gpufix.logscan import framework_of, frameworks_in

    def titles(text: str) -> list[str]:
        [root] = [f for f in diagnose_inputs([STDIN], pack, stdin=io.BytesIO(text.encode())).findings
                  if f.consequence_of is None]
        assert root.category == "cpu_fallback", root.code
        return [fix.title for fix in root.fixes]

    tf = titles("I tensorflow/core/common_runtime/direct_session.cc:45] Direct session inter op parallelism threads: 8\n"
                "Device mapping: no known devices.")
    assert any("TensorFlow registers" in t for t in tf) and any("tensorflow[and-cuda]" in t or "TensorFlow 2.14" in t for t in tf)
    assert not any("torch" in t for t in tf)
    jax = titles("  File \"/usr/lib/python3.10/site-packages/jax/_src/xla_bridge.py\", line 520, in backends\n"
                 "RuntimeError: Invalid device, must be cuda device")
    assert any("JAX sees" in t for t in jax) and not any("torch" in t for t in jax)
    for text in ("Device mapping: no known devices.",  # no framework named: torch's check, the commonest case
                 "  File \"/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py\", line 463, in cuda\n"
                 "RuntimeError: Invalid device, must be cuda device"):
        plain = titles(text)
        assert any("what torch sees" in t for t in plain) and not any("TensorFlow" in t for t in plain)
    assert framework_of({"tensorflow", "pytorch"}) is None and framework_of(set()) is None  # a mix names none
    # the bare words in prose are no framework: an RL agent's "paddle", a web log's "ajax"
    assert frameworks_in(b"episode 12: agent moved the paddle. GET /ajax/status 200") == set()
    assert frameworks_in(b"  File \"/usr/lib/python3/site-packages/paddle/fluid/framework.py\"") == {"paddle"}
    # several files of one failure: one naming TensorFlow and one naming none keep TensorFlow's advice; a third that
    # names torch leaves the framework unknown, and torch's check comes back
    tf_log, plain_log, torch_log = tmp_path / "tf.log", tmp_path / "plain.log", tmp_path / "torch.log"
    tf_log.write_text("I tensorflow/core/common_runtime/direct_session.cc:45] threads: 8\n", encoding="utf-8")
    plain_log.write_text("Device mapping: no known devices.\n", encoding="utf-8")
    torch_log.write_text("  File \"/opt/conda/lib/python3.10/site-packages/torch/cuda/__init__.py\", line 1\n",
                         encoding="utf-8")

    def file_titles(paths: list[Path]) -> list[str]:
        [root] = [f for f in diagnose_inputs([str(p) for p in paths], pack).findings if f.consequence_of is None]
        return [fix.title for fix in root.fixes]

    assert any("TensorFlow registers" in t for t in file_titles([tf_log, plain_log]))
    mixed = file_titles([tf_log, plain_log, torch_log])
    assert any("what torch sees" in t for t in mixed) and not any("TensorFlow registers" in t for t in mixed)
    # the memory family the same way: Keras's mixed precision for a TensorFlow log, torch.autocast elsewhere
    tf_oom = "  File \"/usr/lib/python3/site-packages/tensorflow/python/eager/execute.py\", line 54, in quick_execute\n" \
             "tensorflow.python.framework.errors_impl.InternalError: Failed copying input tensor to GPU:0: GPU out of memory"
    [root] = [f for f in diagnose_inputs([STDIN], pack, stdin=io.BytesIO(tf_oom.encode())).findings if f.consequence_of is None]
    snippets = [fix.snippet or "" for fix in root.fixes]
    assert root.category == "oom" and any("mixed_precision" in s for s in snippets)
    assert not any("torch." in s for s in snippets)


# fixtures/wordings: 7534 wordings written from knowledge and source of the libraries (README there). Not every entry
# can agree: some are label calls the corpus settles otherwise. The floor is what was measured less a little (92.5% of
# the first 1674 when they were written, 2026-12-02; the sixth round scored 79.7% before rules learnt its settled
# wordings, the seventh 89.8%, the eighth 93.0%, the ninth 90.1%, the tenth, the error and status tables read from
# source, 86.6%, the eleventh 88.5%, the twelfth 88.7%, the thirteenth 84.9%, the fourteenth 80.4%, the fifteenth
# 86.3%, the sixteenth 81.3%, the seventeenth 86.1%, the eighteenth 65.2% (mostly label calls the corpus settles
# otherwise), the nineteenth 88.6% as written; 92.1% of 5625 after they were learnt, 92.2% with GEN021, 92.3% with
# ENV900's launch and install wordings, 92.4% of 5906 with the nineteenth learnt, 92.2% of 6088 with the twentieth
# (mostly label calls the corpus settles otherwise). As written, then after the rules learnt them: the twenty-first
# 91.0% then 93.9%, the twenty-second 77.6% then 80.1%, the twenty-third 91.9% then 94.1%, the twenty-fourth 88.2% then
# 90.9%, the twenty-fifth 75.7% then 88.8%, the twenty-sixth (loaders and checkpoint prefixes, the two categories the
# inventory knows least) 72.2% then 78.5% (91.3% of 7534 in all, so the floor moved from 0.915 to 0.91: the new
# wordings are harder, no known one was lost), the twenty-seventh 78.1% then 86.1% (rules alone); 91.1% of 7735 in all
# (the 7534 earlier ones unchanged at 91.25%); the twenty-eighth (other languages' stacks; arch and distributed) 81.3%
# then 89.7% (rules alone), 91.1% of 7938; the twenty-ninth (start-up banners and fallbacks of cpu and arch; NaN, loader
# and distributed lines of 2023-2026 trainers; three quarters near misses) 82.6% then 87.7%, 90.96% of 8254 in all, so the
# floor moved from 0.91 to 0.905 (the 7938 earlier ones unchanged at 91.09%, 7231 of them, before and after).
# The twentieth session wrote rules from the inventories' own disagreements (library refusals, build checks, printed
# loss forms, the Trainer's resume key lists, batchgenerators' dead workers): 90.97% -> 91.52% of 8254, so the floor moved from 0.905 to 0.91.
# A change that loses known wordings fails here.
# Measured with the rules alone: the word model is trained on these wordings (rules/README.md, The word model).
INVENTORY_AGREEMENT = 0.91


def test_known_wordings_keep_their_categories(pack) -> None:  # type: ignore[no-untyped-def]
    import yaml

    folder = Path(__file__).resolve().parents[2] / "fixtures" / "wordings"
    entries = [e for path in sorted(folder.glob("*.yaml")) for e in yaml.safe_load(path.read_text(encoding="utf-8"))]
    assert len(entries) > 1000
    agree = 0
    for entry in entries:
        agree += predict_text(str(entry["text"]), pack)[0] == entry["category"]
    assert agree / len(entries) >= INVENTORY_AGREEMENT, (agree, len(entries))
