# "Who goes next": queue ordering, quotas and preemption candidates (part of gpupool_sched).
target_sources(gpupool_sched PRIVATE src/sched/queueing.cc src/sched/preemption.cc src/sched/queue_access.cc
                                     src/sched/reservation.cc)

if(GPUPOOL_BUILD_TESTS)
  gpupool_test(queueing_test src/sched/queueing_test.cc src/sched/preemption_test.cc src/sched/reservation_test.cc)
endif()
