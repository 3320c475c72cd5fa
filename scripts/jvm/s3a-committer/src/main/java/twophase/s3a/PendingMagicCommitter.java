package twophase.s3a;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.commit.files.PendingSet;
import org.apache.hadoop.fs.s3a.commit.files.SinglePendingCommit;
import org.apache.hadoop.fs.s3a.commit.impl.CommitContext;
import org.apache.hadoop.fs.s3a.commit.magic.MagicS3GuardCommitter;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.TaskAttemptContext;

/**
 * Hadoop's magic committer, less its task and job commits' S3 traffic: tasks write as the magic committer
 * does (each file a pending multipart upload to its final key), but
 * <ul>
 *   <li>no magic folder is created (setupJob/setupTask make no directory marker);</li>
 *   <li>a task commit writes no .pendingset: it loads the task's pending uploads (from the S3A client's
 *       memory when the filesystem tracks magic commits in memory,
 *       fs.s3a.committer.magic.track.commits.in.memory.enabled=true, else from the task attempt's .pending
 *       files, which it then deletes) and hands them to {@link PendingCommitProtocol}, which returns them to
 *       the driver in Spark's TaskCommitMessage;</li>
 *   <li>the job commit completes nothing, writes no _SUCCESS and deletes nothing.</li>
 * </ul>
 * The uploads stay pending until twophase's commit completes them (or its abort/sweep aborts them). A task
 * attempt that fails before its commit leaves uploads no message names: Spark's abortTask aborts those it
 * tracked, twophase's sweep the rest (a lost executor's).
 */
public class PendingMagicCommitter extends MagicS3GuardCommitter {

  static final String IN_MEMORY = "fs.s3a.committer.magic.track.commits.in.memory.enabled";

  public PendingMagicCommitter(Path outputPath, TaskAttemptContext context) throws IOException {
    super(outputPath, context);
  }

  @Override
  public String getName() {
    return "twophase-pending-magic";
  }

  /**
   * Whether the S3A client that writes the files tracks magic commits in memory: it decides (from the
   * configuration it was created with, not the job's), so the task commit must follow it, never the job's
   * setting (a mismatch would load no upload at all).
   */
  boolean tracksInMemory() throws IOException {
    return getDestS3AFS().getConf().getBoolean(IN_MEMORY, false);
  }

  /** No magic folder: the task attempt paths are prefixes of upload keys, nothing needs a marker. */
  @Override
  public void setupJob(JobContext context) {
  }

  @Override
  public void setupTask(TaskAttemptContext context) {
  }

  /** Always: the task commit hands back what the task wrote (there is no folder to probe). */
  @Override
  public boolean needsTaskCommit(TaskAttemptContext context) {
    return true;
  }

  private List<SinglePendingCommit> committed = new ArrayList<>();

  /**
   * Loads the task attempt's pending uploads and keeps them for {@link #takeCommitted()}; writes nothing.
   * Called only after Spark's commit coordinator allowed this attempt.
   */
  @Override
  public void commitTask(TaskAttemptContext context) throws IOException {
    boolean memory = tracksInMemory();
    Configuration conf = context.getConfiguration();
    conf.setBoolean(IN_MEMORY, memory);
    PendingSet loaded = loadPendingCommits(context);
    String jobId = String.valueOf(context.getJobID());
    String taskId = String.valueOf(context.getTaskAttemptID());
    for (SinglePendingCommit c : loaded.getCommits()) {
      c.setJobId(jobId);
      c.setTaskId(taskId);
    }
    committed = new ArrayList<>(loaded.getCommits());
    if (!memory) {
      deleteTaskAttemptPathQuietly(context);  // the .pending files and 0-byte markers
    }
  }

  /** The pending uploads of the last committed task attempt, as a pendingset's JSON. */
  String takeCommitted() throws IOException {
    PendingSet set = new PendingSet();
    for (SinglePendingCommit c : committed) {
      set.add(c);
    }
    committed = new ArrayList<>();
    return new String(set.toBytes(PendingSet.serializer()), java.nio.charset.StandardCharsets.UTF_8);
  }

  @Override
  public void abortTask(TaskAttemptContext context) throws IOException {
    context.getConfiguration().setBoolean(IN_MEMORY, tracksInMemory());
    super.abortTask(context);
  }

  /** Nothing: {@link PendingCommitProtocol#commitJob} hands the task messages' uploads to twophase. */
  @Override
  public void commitJob(JobContext context) {
  }

  /** Never lists and aborts every upload under the destination (other writers' uploads). */
  @Override
  protected void abortPendingUploadsInCleanup(boolean suppressExceptions, CommitContext commitContext) {
  }
}
