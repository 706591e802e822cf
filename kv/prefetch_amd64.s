#include "textflag.h"

// func prefetchSlots(base, mask, size uintptr, hs []BlockHash)
TEXT ·prefetchSlots(SB), NOSPLIT, $0-48
	MOVQ base+0(FP), AX
	MOVQ mask+8(FP), BX
	MOVQ size+16(FP), CX
	MOVQ hs_base+24(FP), SI
	MOVQ hs_len+32(FP), DI
	TESTQ DI, DI
	JEQ done
loop:
	MOVQ (SI), DX
	ANDQ BX, DX
	IMULQ CX, DX
	PREFETCHT0 (AX)(DX*1)
	ADDQ $8, SI
	DECQ DI
	JNE loop
done:
	RET

// func prefetchAddr(p uintptr)
TEXT ·prefetchAddr(SB), NOSPLIT, $0-8
	MOVQ p+0(FP), AX
	PREFETCHT0 (AX)
	RET
