#include <immintrin.h>
#include <stdio.h>
#include <pthread.h>
#include <time.h>
#include <stdlib.h>
static long iters = 200000000;
static int use512 = 1;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx512f"))) static void* run512(void*a){
  __m512 acc[12]; __m512 x=_mm512_set1_ps(1.0000001f), y=_mm512_set1_ps(0.9999999f);
  for(int i=0;i<12;i++) acc[i]=_mm512_set1_ps(i);
  for(long it=0; it<iters; it++){
#pragma GCC unroll 12
    for(int i=0;i<12;i++) acc[i]=_mm512_fmadd_ps(acc[i],x,y);
  }
  float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(acc[i]);
  *(float*)a=s; return 0;}
__attribute__((target("avx2,fma"))) static void* run256(void*a){
  __m256 acc[12]; __m256 x=_mm256_set1_ps(1.0000001f), y=_mm256_set1_ps(0.9999999f);
  for(int i=0;i<12;i++) acc[i]=_mm256_set1_ps(i);
  for(long it=0; it<iters; it++){
#pragma GCC unroll 12
    for(int i=0;i<12;i++) acc[i]=_mm256_fmadd_ps(acc[i],x,y);
  }
  float s=0; float t[8]; for(int i=0;i<12;i++){_mm256_storeu_ps(t,acc[i]); s+=t[0];}
  *(float*)a=s; return 0;}
int main(int argc,char**argv){
  int nt=atoi(argv[1]); use512=atoi(argv[2]); iters=atol(argv[3]);
  pthread_t th[8]; float r[8]; double t0=now();
  for(int i=0;i<nt;i++) pthread_create(&th[i],0,use512?run512:run256,&r[i]);
  for(int i=0;i<nt;i++) pthread_join(th[i],0);
  double dt=now()-t0; double flops=(double)nt*iters*12*(use512?16:8)*2;
  printf("threads %d %s: %.3f s, %.1f GFLOPS (%.1f per thread)\n",nt,use512?"avx512":"avx2",dt,flops/dt/1e9,flops/dt/1e9/nt);
  return 0;}
