package twophase.s3a;

import java.io.IOException;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.s3a.commit.impl.CommitContext;
import org.apache.hadoop.fs.s3a.commit.magic.MagicS3GuardCommitter;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.TaskAttemptContext;

/**
 * Hadoop's magic committer, less its job commit: tasks write and commit as the magic committer does
 * (each file a pending multipart upload, each committed task attempt one .pendingset under the job's
 * magic folder), but commitJob completes nothing, writes no _SUCCESS and deletes nothing. The uploads
 * stay pending until twophase's commit completes them (or its abort/sweep aborts them).
 */
public class PendingMagicCommitter extends MagicS3GuardCommitter {

  public PendingMagicCommitter(Path outputPath, TaskAttemptContext context) throws IOException {
    super(outputPath, context);
  }

  @Override
  public String getName() {
    return "twophase-pending-magic";
  }

  /**
   * Hadoop option: where the job commit writes its manifest (the pendingsets' paths, one a line), outside
   * the magic folder (a file written inside it would become a pending upload itself): twophase's own folder.
   */
  public static final String MANIFEST = "twophase.s3a.manifest";

  private int expectedTasks = -1;

  /** Set by the commit protocol on the driver before commitJob: the number of tasks Spark committed. */
  void expectTasks(int tasks) {
    expectedTasks = tasks;
  }

  /**
   * Checks that the job attempt folder holds one pendingset per committed task and lists them in a
   * manifest (twophase reads exactly those); completes nothing, deletes nothing.
   */
  @Override
  public void commitJob(JobContext context) throws IOException {
    Path attempt = getJobAttemptPath(context);
    String manifest = context.getConfiguration().get(MANIFEST);
    if (manifest == null || manifest.isEmpty() || manifest.contains("__magic")) {
      throw new IOException("twophase: " + MANIFEST + " must name a file outside the magic folder");
    }
    java.util.List<String> sets = new java.util.ArrayList<>();
    if (getDestFS().exists(attempt)) {
      for (FileStatus st : getDestFS().listStatus(attempt)) {
        if (st.getPath().getName().endsWith(".pendingset")) {
          sets.add(st.getPath().toUri().getPath());
        }
      }
    }
    if (expectedTasks >= 0 && sets.size() != expectedTasks) {
      throw new IOException("twophase: job " + getUUID() + " committed " + expectedTasks + " task(s) but "
          + sets.size() + " pendingset(s) are under " + attempt);
    }
    java.util.Collections.sort(sets);
    try (org.apache.hadoop.fs.FSDataOutputStream out = getDestFS().create(new Path(manifest), true)) {
      out.write((String.join("\n", sets) + "\n").getBytes(java.nio.charset.StandardCharsets.UTF_8));
    }
  }

  /** Never lists and aborts every upload under the destination (other writers' uploads). */
  @Override
  protected void abortPendingUploadsInCleanup(boolean suppressExceptions, CommitContext commitContext) {
  }
}
